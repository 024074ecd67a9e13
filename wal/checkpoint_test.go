package wal

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/l0store/l0/internal/fsutil"
)

// TestASegmentGoesOnlyOnceTheNextHoldsItsCheckpoint: a segment with no live page but
// a shard's floor and epoch must stay until the segment after it has its checkpoint
// synced. A reopen that writes nothing, then a power loss, must find the floor and
// epoch. The simulation found this: its machine reopened short of the floor its
// watermark claimed.
func TestASegmentGoesOnlyOnceTheNextHoldsItsCheckpoint(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := Options{FS: fs, RecycleSegments: -1}
	l := open(t, "wal", opts)
	if err := l.SetEpoch("s", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Adopt("s", 2, 6, false); err != nil { // no pages: the floor moves to 6
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, "wal", opts)          // writes no group
	time.Sleep(50 * time.Millisecond) // the flusher removes what it was handed
	// A later directory sync (the next segment's, the watermark's) makes any such
	// removal durable.
	if err := fsutil.SyncDir(fs, "wal"); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 0})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, "wal", Options{FS: crashed, RecycleSegments: -1})
	defer l.Close()
	if info := l.Info("s"); info.Floor != 6 || info.Next != 6 || info.Epoch != 2 {
		t.Fatalf("after a reopen and a power loss: %+v, want floor and next 6 at epoch 2", info)
	}
}
