package wal

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// failingMarks is an in-memory file system on which the calls of a write of the
// watermark file in dir (its temporary file, the rename, the directory's sync)
// fail one at a time: once armed with k, the k-th such call fails.
type failingMarks struct {
	dir   string
	armed atomic.Bool
	left  atomic.Int64 // calls to let through before the one that fails
	hit   atomic.Bool  // the armed call failed
}

func (f *failingMarks) fs() vfs.FS {
	return errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !f.armed.Load() {
			return nil
		}
		var ours bool
		switch op.Kind {
		case errorfs.OpOpenDir, errorfs.OpFileSync:
			ours = op.Path == f.dir || op.Path == ackedPath(f.dir)+".tmp"
		case errorfs.OpCreate, errorfs.OpFileWrite, errorfs.OpRename:
			ours = op.Path == ackedPath(f.dir)+".tmp"
		}
		if ours && f.left.Add(-1) == -1 {
			f.hit.Store(true)
			return errors.New("injected: no space left on device")
		}
		return nil
	}))
}

func ackedPath(dir string) string { return dir + "/" + ackedFile }

// arm makes the k-th call of the watermark's next writes fail.
func (f *failingMarks) arm(k int) {
	f.hit.Store(false)
	f.left.Store(int64(k))
	f.armed.Store(true)
}

// checkLoweringFails runs reset, which must lower the shard's acknowledged end
// below what it holds, with each call of its watermark write failing in turn: the
// call must fail, and leave every acknowledged, synced record readable.
func checkLoweringFails(t *testing.T, reset func(l *Log) error) {
	for k := 0; ; k++ {
		f := &failingMarks{dir: "wal"}
		l := open(t, "wal", Options{FS: f.fs(), AckedInterval: time.Hour})
		for range 5 {
			if _, err := l.Append(context.Background(), "s", 0, recs("r", 2)); err != nil {
				t.Fatal(err)
			}
		}
		f.arm(k)
		err := reset(l)
		f.armed.Store(false)
		if !f.hit.Load() {
			// The write has fewer calls than k: every one of them was failed.
			if err != nil {
				t.Fatalf("with no call failed: %v", err)
			}
			if k < 4 {
				t.Fatalf("the watermark write took %d calls, fewer than it makes", k)
			}
			l.Close()
			return
		}
		if err == nil {
			t.Fatalf("call %d of the watermark write failed, yet the reset succeeded", k)
		}
		info := l.Info("s")
		got := readAll(t, l, "s", info.Floor)
		next, _, err := l.Extent("s", info.Floor, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(got)) != info.Next-info.Floor || next != info.Next {
			t.Fatalf("call %d of the watermark write failed: the shard holds %d..%d, all acknowledged and synced, but a read yields %d records and Extent ends at %d",
				k, info.Floor, info.Next, len(got), next)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAFailedAdoptKeepsTheAcknowledgedEnd: an adoption of a superseded backlog
// lowers the shard's acknowledged end in the watermark before it drops the pages.
// When that write fails nothing is dropped, and a read still ends at the end of the
// records whose append had synced; Extent likewise.
func TestAFailedAdoptKeepsTheAcknowledgedEnd(t *testing.T) {
	checkLoweringFails(t, func(l *Log) error {
		_, err := l.Adopt("s", 0, 4, false)
		return err
	})
}

// TestAFailedImportKeepsTheAcknowledgedEnd is the same for an import that ends
// below the shard's acknowledged end.
func TestAFailedImportKeepsTheAcknowledgedEnd(t *testing.T) {
	checkLoweringFails(t, func(l *Log) error {
		return l.Import("s", 0, 4, 4, recs("imp", 1))
	})
}
