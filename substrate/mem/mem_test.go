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
	substratetest.RunConformance(t, func(t testing.TB) substrate.Driver { return mem.New() })
}

func BenchmarkDriver(b *testing.B) {
	substratetest.RunBenchmarks(b, func(testing.TB) substrate.Driver { return mem.New() })
}
