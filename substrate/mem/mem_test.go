package mem_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	substratetest.RunConformance(t, substratetest.Config{
		NewDriver: func(t testing.TB) substrate.Driver { return mem.New() },
		// A mem driver is its own bucket: it has no name that could be wrong and no
		// directory that could be removed, so it cannot be missing.
		NoMissingBucket: "a mem driver is its own bucket and cannot be missing",
	})
}

func BenchmarkDriver(b *testing.B) {
	substratetest.RunBenchmarks(b, func(testing.TB) substrate.Driver { return mem.New() })
}
