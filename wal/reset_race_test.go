package wal

import (
	"context"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// heldAppendThenReset sets up a shard whose append is synced and held back from
// its acknowledgement (its shipment held, Remote mode), while the shard's new owner
// resets it below that append's end (SetEpoch, Adopt without keep). It returns
// the log, with the append acknowledged after the reset.
func heldAppendThenReset(t *testing.T, dir string, opts Options) (*Log, *testSink) {
	t.Helper()
	ctx := context.Background()
	l := open(t, dir, opts)
	sink := &testSink{}
	l.ShipTo(sink, ShipOptions{Remote: true})
	if err := l.SetEpoch("s", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "s", 1, recs("a", 3)); err != nil {
		t.Fatal(err)
	}
	// The sink holds the next page's shipment.
	sink.hold()
	appended := make(chan error, 1)
	go func() {
		_, err := l.Append(ctx, "s", 1, recs("held", 4)) // offsets 3..6
		appended <- err
	}()
	waitFor(t, func() bool { return l.Info("s").Next == 7 })
	// A new owner of the shard on this log: its epoch entry's group is at or after
	// the held page's, so once SetEpoch returns the page is synced.
	if err := l.SetEpoch("s", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Adopt("s", 2, 3, false); err != nil {
		t.Fatal(err)
	}
	// The shipment is done: the old owner's append is acknowledged (stranded).
	sink.release()
	if err := <-appended; err != nil {
		t.Logf("held append: %v", err)
	}
	return l, sink
}

// TestAResetRacingAHeldAppendKeepsAckedWithinTheShard: an append that synced
// before a reset (Adopt without keep) and is acknowledged after it raises the
// shard's acked watermark (st.acked) past the shard's end: the reset stored
// acked = next, and the append's CAS loop only ever raises it.
//
// Expected: acked never exceeds the shard's next offset.
func TestAResetRacingAHeldAppendKeepsAckedWithinTheShard(t *testing.T) {
	l, _ := heldAppendThenReset(t, t.TempDir(), Options{})
	defer l.Close()
	st := l.state("s")
	if acked, next := st.acked.Load(), l.Info("s").Next; acked > next {
		t.Fatalf("after the reset to 3 and the held append's acknowledgement: acked %d, the shard's next %d", acked, next)
	}
}

// TestAResetRacingAHeldAppendReopensCleanly: the consequence of the above. A
// clean Close writes the l0-acked watermark with acked 7 for a shard whose log
// holds nothing past 3; the next Open reports corruption for a log nothing damaged.
func TestAResetRacingAHeldAppendReopensCleanly(t *testing.T) {
	dir := t.TempDir()
	l, _ := heldAppendThenReset(t, dir, Options{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("reopen after a clean close: %v", err)
	}
	l2.Close()
}

// TestAResetRacingAHeldAppendNeverYieldsAnUnsyncedPage: with acked left past
// the shard's end, the next owner's append whose group is not yet synced falls
// below acked, and Pages takes it: a page with no segment yet (its group is not
// placed), so the read dereferences a nil segment (pin: s.pins++ on a nil
// *segment), or yields a page before it is durable.
func TestAResetRacingAHeldAppendNeverYieldsAnUnsyncedPage(t *testing.T) {
	var gate syncGate
	dir := t.TempDir()
	l, _ := heldAppendThenReset(t, dir, Options{FS: syncFS{FS: vfs.Default, onSync: gate.wait}})
	defer l.Close()
	release := gate.hold()
	defer release()
	appended := make(chan error, 1)
	go func() {
		_, err := l.Append(context.Background(), "s", 2, recs("new", 1)) // offset 3
		appended <- err
	}()
	waitFor(t, func() bool { return l.Info("s").Next == 4 })
	<-gate.held // the flusher is inside that page's sync
	// A second page waits in the filling group: not placed in a segment yet.
	appended2 := make(chan error, 1)
	go func() {
		_, err := l.Append(context.Background(), "s", 2, recs("newer", 1)) // offset 4
		appended2 <- err
	}()
	waitFor(t, func() bool { return l.Info("s").Next == 5 })
	func() {
		defer func() {
			if r := recover(); r != nil {
				release()
				<-appended
				<-appended2
				t.Fatalf("Pages during the new append's sync panicked: %v", r)
			}
		}()
		for p, err := range l.Pages("s", 3) {
			if err != nil {
				if !errors.Is(err, ErrTruncated) {
					t.Errorf("read: %v", err)
				}
				break
			}
			t.Errorf("Pages yielded the page at %d before its sync", p.FirstOffset)
		}
	}()
	release()
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if err := <-appended2; err != nil {
		t.Fatal(err)
	}
}
