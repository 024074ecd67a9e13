package engine

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// A's Dir is copied while A runs (a backup restored on machine C, A still up but
// cut off from its operator). C's engine takes A's instance lease under a token of
// its own, carrying A's (lease.Continue), and opens y, which its WAL says is its
// own (no tail fence), and appends. A's next renewal must meet C's token and lose
// the lease, so that A acknowledges nothing more: two engines must never both
// acknowledge appends to y. (Continuing under A's very token, neither ever lost.)
func TestACopiedDirBesideItsOriginalCutsTheOriginalOff(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	short := lateLease
	dirA := t.TempDir()
	optsA := Options{Dir: dirA, Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	eA := open(t, optsA)
	yA := openShard(t, eA, "y")
	appendBatches(t, yA, 2)

	dirC := filepath.Join(t.TempDir(), "copy")
	copyLiveDir(t, dirC, dirA)
	optsC := optsA
	optsC.Dir = dirC
	optsC.Bucket = substratetest.NewBucket(t, "shared", drv)
	eC := open(t, optsC)
	yC := openShard(t, eC, "y")
	offC, err := yC.Append(ctx, []byte("C's"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // two renewals of each
	if _, err := yC.Append(ctx, []byte("C's again")); err != nil {
		t.Logf("C's append: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if offA, err := yA.Append(actx, []byte("A's, after C took y")); err == nil {
		_, errA := eA.heldLease().Valid()
		_, errC := eC.heldLease().Valid()
		t.Fatalf("A acknowledged an append to y at offset %d (C's first append got offset %d) 2.5 s after C (A's Dir copied, its lease continued under A's token %s) took y and appended to it; A's lease valid: %v, C's: %v (same token: %v)", offA, offC,
			eA.heldLease().Token(), errA, errC, eA.heldLease().Token() == eC.heldLease().Token())
	} else {
		t.Logf("A's append after C took y: %v", err)
	}
}

// copyLiveDir copies the Dir of a running engine to dst, as an operator's copy
// of a live directory does: a file that goes between the listing and its read
// (a temporary file renamed into place) is not copied.
func copyLiveDir(t *testing.T, dst, src string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", src, err)
	}
}
