package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// TestALateFenceIntoACollectedIncarnationLeavesEveryShardOpenable: a takeover
// fences the live incarnation of the chain version its mark wrote. If, between
// that mark and the fence, the owner ends that incarnation (it reincarnates) and
// its own collector deletes the incarnation's objects (they are unneeded and old
// once the incarnation is no longer live), the takeover's Fence finds no writer
// object below the existing fence and "fills" every sequence from the fence down
// to its from with zero-byte fences. The incarnation, ended in the chain at f,
// now holds fences below f. Every later reader of that incarnation from a
// pointer below f fails in ReadShard with "a fence below the stream's end"
// (corruption), though nothing was damaged: the shard is unopenable anywhere,
// for good.
//
// Interleaving (A the owner, collecting every 10 ms objects 1 ms old; B, whose
// clock says A's leases ran out):
//  1. A opens z, s, y, x; each gets records and is sealed, so each pointer
//     moves to A's next position in incarnation I1 (z's lowest), and no object of
//     I1 is needed by any shard: A's collector deletes all of I1 but its last
//     object (the live stream's last is kept).
//  2. B takes x over: it marks x and fences I1 at f.
//  3. B starts to take s over: its mark lands (the chain it returns lists I1
//     live); its Fence's listing of I1 is slow (2 s).
//  4. A appends to y: the page meets the fence, A's Reincarnate ends I1 at f and
//     starts I2. I1 is no longer live: A's collector deletes its last object.
//  5. B's Fence lists I1 from s's pointer: only the fence at f. It fills f-1, f-2,
//     ... down to s's pointer with fences. B takes s (its history is empty).
//  6. B opens z: the chain lists I1 ended at f; ReadShard(I1, z's pointer, f)
//     meets a fence below f and reports the stream corrupt.
//
// Expected: B opens z (its history past the sealed watermark is empty). Before
// the fix it failed 8 runs of 8 as above. A reader now takes fences below an
// incarnation's end, before any object, for what collection deleted there
// (listFrom): a late fill can only put them where no object is left, since Fence
// stops at the writer's last object and collection deletes a stream from its
// start.
func TestALateFenceIntoACollectedIncarnationLeavesEveryShardOpenable(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, _, fb := twoMachines(t, LeaseOptions{}, 0)
	optsA = fastCollect(optsA)
	clkA, clkB := testclock.New(), testclock.New()
	optsA.Clock, optsB.Clock = clkA, clkB
	clkB.Advance(time.Minute) // past A's 30 s lease and its skew margin
	eA, eB := open(t, optsA), open(t, optsB)
	shards := map[string]*shard.Shard{}
	for _, id := range []string{"z", "s", "y", "x"} {
		sh := openShard(t, eA, id)
		shards[id] = sh
		for i := range 2 {
			if _, err := sh.Append(ctx, recs(fmt.Sprintf("%s%d", id, i), 3)...); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := sh.Seal(ctx, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	inst := eA.Instance()
	i1 := eA.tail.Incarnation()
	// 1. Everything of I1 is sealed: A's collector takes all but the live
	// stream's last object.
	waitFor(t, 10*time.Second, "A's collector deleting I1 but its last object", func() bool {
		clkA.Advance(10 * time.Millisecond)
		return len(streamKeys(t, optsA.Bucket, inst, i1)) == 1
	})

	// 2. B takes x over: mark, fence of I1.
	if _, err := eB.OpenShard(ctx, "x"); err != nil {
		t.Fatal(err)
	}

	// 3. B's takeover of s: the mark lands, the fence's listing is slow.
	fb.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpList}, Key: "^tail/", Latency: 2 * time.Second})
	type opened struct{ err error }
	sDone := make(chan opened, 1)
	go func() {
		_, err := eB.OpenShard(ctx, "s")
		sDone <- opened{err}
	}()
	waitFor(t, 10*time.Second, "B's mark of s in A's chain", func() bool {
		c, _, err := tail.ReadChain(ctx, optsA.Bucket, inst)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range c.Marks {
			if m.Shard == "s" {
				return true
			}
		}
		return false
	})

	// 4. A's append to y meets the fence: A reincarnates, and I1's last object
	// goes.
	if _, err := shards["y"].Append(ctx, []byte("meets the fence")); err != nil {
		t.Fatalf("A's append to y after the fence: %v", err)
	}
	if inc := eA.tail.Incarnation(); inc == i1 {
		t.Fatalf("A still ships in incarnation %d", inc)
	}
	waitFor(t, 10*time.Second, "A's collector deleting I1's last object", func() bool {
		clkA.Advance(10 * time.Millisecond)
		return len(streamKeys(t, optsA.Bucket, inst, i1)) == 0
	})

	// 5. B's slow fence of I1 runs now, and B takes s.
	select {
	case o := <-sDone:
		if o.err != nil {
			t.Logf("B's open of s: %v", o.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("B's open of s did not return")
	}
	fb.SetRules()
	_, fences := tailObjects(t, optsA.Bucket)
	t.Logf("fences now: %v", fences)

	// 6. z, sealed and idle on A, its pointer in I1 below the fence: B opens it.
	if _, err := eB.OpenShard(ctx, "z"); err != nil {
		t.Fatalf("B's open of z, whose records are all sealed and whose tail nobody damaged: %v", err)
	}
}
