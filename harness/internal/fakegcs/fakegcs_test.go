package fakegcs_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/l0store/l0/harness/internal/fakegcs"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/gcs"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fake-gcs-server pulls in opencensus, which starts a worker at init.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// TestTheGCSDriverConformsInProcess runs the substrate conformance suite on the GCS
// driver against fake-gcs-server served from this process over a real loopback
// listener (the library's own test, substrate/gcs, runs it against the binary).
func TestTheGCSDriverConformsInProcess(t *testing.T) {
	srv, err := fakegcs.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunConformance(t, substratetest.Config{
		NewDriver: harness(srv.Endpoint),
		// A bucket name that was never created: the misconfigured store.
		MissingBucket: func(t testing.TB) substrate.Driver {
			d, err := gcs.Open(t.Context(), gcs.Config{Bucket: fmt.Sprintf("l0-missing-%d", buckets.Add(1)), Endpoint: srv.Endpoint})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}

func BenchmarkGCSInProcess(b *testing.B) {
	srv, err := fakegcs.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunBenchmarks(b, harness(srv.Endpoint))
}

var buckets atomic.Int64

// harness gives each test a fresh bucket: the emulator's memory backend slows down
// as a bucket grows.
func harness(endpoint string) substratetest.Harness {
	return func(t testing.TB) substrate.Driver {
		d, err := emulator.NewGCSDriver(t.Context(), endpoint, fmt.Sprintf("l0-conformance-%d", buckets.Add(1)))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}
