package gcs_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/storage"
	"go.uber.org/goleak"
	"google.golang.org/api/option"

	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/gcs"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestConformanceProcess runs the suite against the fake-gcs-server binary, or the
// emulator at STORAGE_EMULATOR_HOST. (The harness module runs it against
// fake-gcs-server served in-process too: harness/internal/fakegcs.)
func TestConformanceProcess(t *testing.T) {
	srv, err := emulator.StartGCSProcess()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunConformance(t, conformance(srv.Endpoint))
}

var buckets atomic.Int64

func conformance(endpoint string) substratetest.Config {
	return substratetest.Config{
		NewDriver: harness(endpoint),
		// A bucket name that was never created: the misconfigured store.
		MissingBucket: func(t testing.TB) substrate.Driver {
			d, err := gcs.Open(t.Context(), gcs.Config{Bucket: fmt.Sprintf("l0-missing-%d", buckets.Add(1)), Endpoint: endpoint})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	}
}

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

// The driver remembers that its bucket exists, so that reads of missing objects cost
// one request. A bucket deleted later must not stay remembered: the next write finds
// it missing, and from then on reads say so too.
func TestABucketDeletedUnderTheDriverIsFoundMissingByTheNextWrite(t *testing.T) {
	srv, err := emulator.StartGCSProcess()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx := t.Context()
	admin, err := storage.NewClient(ctx, option.WithEndpoint(srv.Endpoint), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	const name = "l0-deleted"
	if err := admin.Bucket(name).Create(ctx, "l0", nil); err != nil {
		t.Fatal(err)
	}
	d, err := gcs.Open(ctx, gcs.Config{Bucket: name, Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	b := substratetest.NewBucket(t, "gcs", d)
	if _, err := b.PutBytes(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Attributes(ctx, "missing"); !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("attributes of a missing key in the bucket: %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Bucket(name).Delete(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = b.PutBytes(ctx, "k", []byte("v"))
	if !errors.Is(err, substrate.ErrBucketNotFound) {
		t.Fatalf("put into the deleted bucket: err = %v, want ErrBucketNotFound", err)
	}
	_, err = b.Attributes(ctx, "missing")
	if !errors.Is(err, substrate.ErrBucketNotFound) {
		t.Fatalf("attributes after the put found the bucket missing: err = %v, want ErrBucketNotFound", err)
	}
}

func BenchmarkProcess(b *testing.B) {
	srv, err := emulator.StartGCSProcess()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunBenchmarks(b, harness(srv.Endpoint))
}
