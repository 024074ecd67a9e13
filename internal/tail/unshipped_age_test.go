package tail

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// TestAnObjectStartedByAnEpochChangeCountsItsAge: Flusher.Add starts a new
// batch when a shard's page comes under another epoch than the shard's pending
// section (or at an offset that does not continue it), and sets the `added`
// time only on the batch it found empty, never on the one it starts then. That
// batch's added stays the zero time for good: once it is the oldest pending
// one, Stats().Oldest is zero, so WaitRoom's age bound (Local mode's
// MaxUnshippedAge, 1 s by default) does not hold appends back and
// l0_tail_unshipped_age_seconds reads 0, however long the batch's put keeps
// failing. In the engine the split comes from a shard opened again at a new
// epoch (a lag move back, a restart's adoption, an orphan given back) while
// pages of its previous epoch are still pending, or from Reship giving a
// backlog again from a lower offset.
//
// Here: two pages of shard s under epochs 1 and 2 go in two objects; the first
// is shipped, every put of the second fails. Two seconds later (the flusher's
// clock), the unshipped window is reported as having no age, and a WaitRoom
// with a 1 s bound returns at once.
//
// Expected: Stats().Oldest is when the second page was given, and WaitRoom
// waits (here: until its context ends). Before the fix it failed 3 runs of 3;
// a batch now takes its age from its first page, whichever way it was started.
func TestAnObjectStartedByAnEpochChangeCountsItsAge(t *testing.T) {
	clk := testclock.New()
	// Every put at sequence 1 fails: the second object is never shipped.
	b := bucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/0+1$", Err: fault.ErrInjected})
	f := NewFlusher(NewStream(b, "i-1", 1, 0, "w"), FlushOptions{Interval: 5 * time.Millisecond, Retry: 5 * time.Millisecond, Clock: clk})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		f.Close(ctx)
	}()
	done := f.Gather()
	t0 := f.Add("s", 1, 0, records(2, "epoch 1"))
	t1 := f.Add("s", 2, 0, records(2, "epoch 2")) // another epoch: the next object
	done()
	wait(t, t0)
	if _, ok, _ := t1.State(); ok {
		t.Fatal("the second object was shipped")
	}
	clk.Advance(2 * time.Second)
	st := f.Stats()
	if st.Pending == 0 {
		t.Fatal("nothing pending")
	}
	if st.Oldest.IsZero() {
		t.Errorf("%d bytes pending for 2 s, and Stats().Oldest is the zero time: the unshipped age reads 0", st.Pending)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := f.WaitRoom(ctx, 0, time.Second); err == nil {
		t.Errorf("WaitRoom with a 1 s age bound returned at once, with a page unshipped for 2 s")
	}
}
