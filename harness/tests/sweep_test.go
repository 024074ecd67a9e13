package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
)

// TestEveryAcknowledgedRecordSurvivesTheIthSubstrateFailure is the error-index
// sweep: for i = 1, 2, ... the i-th substrate operation of an engine's life (open,
// seals while appending, the cooperative close) fails, once as a plain error and
// once as an ambiguous one (the write happened, the caller was told it failed),
// until a run passes with no failure injected. After each run a clean engine on the
// same directory and bucket must read back every acknowledged record, exactly once,
// in order.
func TestEveryAcknowledgedRecordSurvivesTheIthSubstrateFailure(t *testing.T) {
	for _, ambiguous := range []bool{false, true} {
		runs := 0
		for i := 1; ; i++ {
			if i > 300 {
				t.Fatalf("ambiguous=%v: the sweep did not end: every run hit an injected failure", ambiguous)
			}
			runs++
			if !sweepRun(t, i, ambiguous) {
				break
			}
		}
		t.Logf("ambiguous=%v: %d runs, the last one untouched", ambiguous, runs)
	}
}

var errInjected = errors.New("injected substrate failure")

// sweepRun runs one engine life with the i-th substrate operation failing and
// verifies; it reports whether the failure was injected.
func sweepRun(t *testing.T, i int, ambiguous bool) bool {
	t.Helper()
	ctx := context.Background()
	dir, store := t.TempDir(), t.TempDir()
	d, err := local.New(filepath.Join(store, "bucket")) // where localBucket(store) opens it
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(d, uint64(i), fault.Rule{Nth: i, Err: errInjected, Ambiguous: ambiguous})
	bucket, err := substrate.New(fd, substrate.Options{Name: "faulty"})
	if err != nil {
		t.Fatal(err)
	}
	opts := engine.Options{Dir: dir, Bucket: bucket, Seal: seal.Options{
		SizeBytes: 2 << 10, Interval: 5 * time.Millisecond, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
	}}
	var acked [][]byte
	if e, err := engine.Open(ctx, opts); err == nil {
		if sh, err := e.OpenShard(ctx, "s"); err == nil {
			for b := range 12 {
				rs := make([][]byte, 4)
				for r := range rs {
					rs[r] = fmt.Appendf(nil, "run %d batch %d record %d %s", i, b, r, bytes.Repeat([]byte("x"), 100))
				}
				first, err := sh.Append(ctx, rs...)
				if err != nil {
					t.Fatalf("run %d: append: %v", i, err) // appends never touch the substrate
				}
				if first != uint64(len(acked)) {
					t.Fatalf("run %d: batch %d at %d, want %d", i, b, first, len(acked))
				}
				acked = append(acked, rs...)
				time.Sleep(2 * time.Millisecond) // let seals interleave
			}
			sh.Close(ctx) // may fail: the seal or the release hit the failure
		}
		if err := e.Close(); err != nil {
			t.Fatalf("run %d: close: %v", i, err)
		}
	}
	bucket.Close()

	// The same replica, its failure over: the same store, under the same name,
	// which the manifests' tail pointers name.
	cd, err := local.New(filepath.Join(store, "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	clean, err := substrate.New(cd, substrate.Options{Name: "faulty"})
	if err != nil {
		t.Fatal(err)
	}
	defer clean.Close()
	opts.Bucket = clean
	e, err := engine.Open(ctx, opts)
	if err != nil {
		t.Fatalf("run %d (ambiguous=%v): reopen: %v", i, ambiguous, err)
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "s")
	if err != nil {
		t.Fatalf("run %d (ambiguous=%v): reopen shard: %v", i, ambiguous, err)
	}
	var got [][]byte
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			t.Fatalf("run %d (ambiguous=%v): read: %v", i, ambiguous, err)
		}
		if rec.Offset != uint64(len(got)) {
			t.Fatalf("run %d: offset %d after %d records", i, rec.Offset, len(got))
		}
		got = append(got, rec.Value)
	}
	if len(got) != len(acked) {
		t.Fatalf("run %d (ambiguous=%v): %d records read back, %d acknowledged", i, ambiguous, len(got), len(acked))
	}
	for k := range got {
		if !bytes.Equal(got[k], acked[k]) {
			t.Fatalf("run %d (ambiguous=%v): record %d differs", i, ambiguous, k)
		}
	}
	return fd.Injected() > 0
}
