package local_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	substratetest.RunConformance(t, substratetest.Config{
		NewDriver: func(t testing.TB) substrate.Driver {
			d, err := local.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		// New creates a missing root, as creating a bucket would; a local bucket goes
		// missing when its root is removed under an open driver.
		MissingBucket: func(t testing.TB) substrate.Driver {
			dir := t.TempDir()
			d, err := local.New(dir)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.Put(t.Context(), "shards/s/manifest", strings.NewReader("m"), substrate.Condition{}); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}

// Two drivers on one root stand for two processes: their conditional writes must
// exclude each other through the lock files, not only through each driver's mutex.
func TestConditionalWritesExcludeAnotherDriverOnTheSameRoot(t *testing.T) {
	dir := t.TempDir()
	var buckets [2]*substrate.Bucket
	for i := range buckets {
		d, err := local.New(dir)
		if err != nil {
			t.Fatal(err)
		}
		if buckets[i], err = substrate.New(d, substrate.Options{}); err != nil {
			t.Fatal(err)
		}
		defer buckets[i].Close()
	}
	ctx := t.Context()
	for round := range 20 {
		key := fmt.Sprintf("m-%d", round)
		base, err := buckets[0].PutBytes(ctx, key, []byte("base"))
		if err != nil {
			t.Fatal(err)
		}
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				_, err := buckets[i%2].CompareAndSwapBytes(ctx, key, base.Version, fmt.Appendf(nil, "racer %d", i))
				if err == nil {
					wins.Add(1)
				} else if !errors.Is(err, substrate.ErrPreconditionFailed) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("round %d: %d winners across two drivers, want 1", round, wins.Load())
		}
	}
}

func TestTheDriverItselfRefusesKeysOutsideItsRoot(t *testing.T) {
	parent := t.TempDir()
	d, err := local.New(filepath.Join(parent, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, key := range []string{"../../escape", "/etc/passwd-copy", "a/../../../escape"} {
		_, err := d.Put(t.Context(), key, strings.NewReader("x"), substrate.Condition{})
		if !errors.Is(err, substrate.ErrInvalidKey) {
			t.Errorf("put %q: err = %v, want ErrInvalidKey", key, err)
		}
		if err := d.Delete(t.Context(), key); !errors.Is(err, substrate.ErrInvalidKey) {
			t.Errorf("delete %q: err = %v, want ErrInvalidKey", key, err)
		}
	}
	entries, err := os.ReadDir(parent)
	if err != nil || len(entries) != 1 {
		t.Fatalf("the parent of the root holds %v (%v), want only the store", entries, err)
	}
}

func TestACorruptObjectFileIsNotReadAsEmptyOrMissing(t *testing.T) {
	dir := t.TempDir()
	d, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := substrate.New(d, substrate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.PutBytes(t.Context(), "k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "objects", "f.k"), []byte("xx"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = b.Get(t.Context(), "k")
	if !errors.Is(err, local.ErrCorrupt) {
		t.Fatalf("get of a truncated object file: err = %v, want ErrCorrupt", err)
	}
}

// Removing objects/ removes every object; a put that recreated it would leave a store
// of one object, which reads as a healthy store that lost the rest.
func TestAPutDoesNotRecreateARemovedStore(t *testing.T) {
	dir := t.TempDir()
	d, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := substrate.New(d, substrate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.PutBytes(t.Context(), "shards/s/manifest", []byte("m")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "objects")); err != nil {
		t.Fatal(err)
	}
	for name, put := range map[string]func() error{
		"put": func() error { _, err := b.PutBytes(t.Context(), "shards/s/parts/p", []byte("x")); return err },
		"put-if-absent": func() error {
			_, _, err := b.PutIfAbsentBytes(t.Context(), "shards/t/manifest", []byte("x"))
			return err
		},
	} {
		if err := put(); !errors.Is(err, substrate.ErrBucketNotFound) {
			t.Errorf("%s into a removed store: err = %v, want ErrBucketNotFound", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "objects")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("objects/ after the puts: %v, want it still missing", err)
	}
}

func BenchmarkDriver(b *testing.B) {
	substratetest.RunBenchmarks(b, func(t testing.TB) substrate.Driver {
		d, err := local.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}
