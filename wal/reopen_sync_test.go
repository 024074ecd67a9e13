package wal

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestAReopenSyncsTheLastGroupItReplays: a segment's last group is written,
// and its fdatasync fails (or the process is killed inside it): the group's bytes
// are in the page cache, not on the disk. The next open (a new process, the same
// page cache) reads the group as valid and, since it is flagged last, does not
// close the segment, so nothing syncs it (closeSegment's SyncData runs only for a
// torn tail). It counts the group's pages as durable, claims them in l0-acked,
// moves on to a new segment and acknowledges more appends there. A power loss
// then takes the unsynced group away: the segment, no longer the newest, ends
// without its last group, and the open reports damage, refusing every record the
// second life acknowledged.
//
// Expected: the open after the power loss succeeds and reads every append the
// second life acknowledged.
func TestAReopenSyncsTheLastGroupItReplays(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	const segSize = 2 << 10
	failed := false
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind != errorfs.OpFileSyncData || !strings.HasSuffix(op.Path, segmentName(1)) || failed {
			return nil
		}
		if fi, err := mem.Stat(op.Path); err == nil && fi.Size() >= segSize {
			failed = true // the sync of segment 1's last group
			return errors.New("injected: fdatasync failed")
		}
		return nil
	})
	opts := Options{FS: errorfs.Wrap(mem, inj), SegmentSize: segSize, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	big := strings.Repeat("x", 300)
	var acked uint64
	for i := 0; ; i++ {
		first, err := l.Append(ctx, "s", 0, [][]byte{[]byte(big)})
		if err != nil {
			if !errors.Is(err, ErrUnknownOutcome) {
				t.Fatalf("append %d: %v", i, err)
			}
			break
		}
		acked = first + 1
	}
	l.Close()
	if !failed {
		t.Fatal("the sync of the last group never ran")
	}

	// A new process on the same disk: what the failed sync left is in its cache.
	opts.FS = mem
	l = open(t, "wal", opts)
	info := l.Info("s")
	t.Logf("the first life acknowledged %d records; the reopen finds %d", acked, info.Next)
	var second []uint64
	for range 3 {
		first, err := l.Append(ctx, "s", 0, recs("second", 1))
		if err != nil {
			t.Fatal(err)
		}
		second = append(second, first)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	// A power loss: only what was synced stays.
	opts.FS = mem.CrashClone(vfs.CrashCloneCfg{})
	l, err := Open("wal", opts)
	if err != nil {
		t.Fatalf("open after the power loss: %v", err)
	}
	defer l.Close()
	got := readAll(t, l, "s", l.Info("s").Floor)
	if uint64(len(got)) < second[len(second)-1]+1 {
		t.Fatalf("after the power loss %d records, the second life acknowledged through %d", len(got), second[len(second)-1])
	}
}

// killFS is a second process's view of a file system a killed process held: its
// lock is free.
type killFS struct{ vfs.FS }

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

func (killFS) Lock(string) (io.Closer, error) { return nopCloser{}, nil }

// TestAReopenAfterAKillInsideTheLastSyncSyncsWhatItReplays is the same with a
// kill -9 instead of a failed sync: the flusher is inside the fdatasync of segment
// 1's last group when the process dies (the sync never happens), and a new process
// opens the log while the group's bytes are only in the page cache.
func TestAReopenAfterAKillInsideTheLastSyncSyncsWhatItReplays(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	const segSize = 2 << 10
	inSync := make(chan struct{})
	killed := make(chan struct{})
	var once sync.Once
	hook := func(name string) bool {
		if !strings.HasSuffix(name, segmentName(1)) {
			return true
		}
		if fi, err := mem.Stat(name); err == nil && fi.Size() >= segSize {
			once.Do(func() { close(inSync) })
			<-killed
			return false // the process is gone: this sync never reaches the disk
		}
		return true
	}
	opts := Options{FS: syncFS{FS: mem, onSync: hook}, SegmentSize: segSize, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	big := strings.Repeat("x", 300)
	appended := make(chan error, 64)
	go func() {
		for {
			_, err := l.Append(ctx, "s", 0, [][]byte{[]byte(big)})
			appended <- err
			if err != nil {
				return
			}
			select {
			case <-inSync:
				return
			default:
			}
		}
	}()
	<-inSync

	// The new process.
	opts2 := Options{FS: killFS{mem}, SegmentSize: segSize, AckedInterval: time.Hour}
	l2 := open(t, "wal", opts2)
	var last uint64
	for range 3 {
		first, err := l2.Append(ctx, "s", 0, recs("second", 1))
		if err != nil {
			t.Fatal(err)
		}
		last = first
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	// The power loss, then the old process's remains are cleaned up.
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	close(killed)
	l.Close()

	l3, err := Open("wal", Options{FS: crashed, SegmentSize: segSize, AckedInterval: time.Hour})
	if err != nil {
		t.Fatalf("open after the power loss: %v", err)
	}
	defer l3.Close()
	if got := readAll(t, l3, "s", l3.Info("s").Floor); uint64(len(got)) < last+1 {
		t.Fatalf("after the power loss %d records, the second process acknowledged through %d", len(got), last)
	}
}
