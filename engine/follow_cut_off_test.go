package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestAFollowerOfAMachineCutOffEndsOnceAnotherMayOwnTheShard: a following read
// ends (ErrFenced, ErrClosed or its context's error) rather than waiting on after
// its handle lost the shard; a plain read through the same handle ends with
// ErrFenced ("the end may not be the history's") as soon as its lease lapsed.
//
// The interleaving: machine A follows x at its end. A is cut off from the object
// store: its renewals fail, and its clock passes its lease's expiry. Machine B,
// whose clock is past A's lease and the skew margin, takes x over (fencing A's
// tail) and acknowledges records of its own. Nothing A can read tells it, and
// no renewal of A's can succeed to start the confirmation that would fence its
// handle. Expected: A's follower ends within a few rechecks, as A's plain read
// does. Found: the follower only ends on Fenced, and a lapsed lease is not
// fenced; it waits silently, for as long as the cut lasts, while B serves x and
// A's own plain read of x fails at once.
func TestAFollowerOfAMachineCutOffEndsOnceAnotherMayOwnTheShard(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	clkA, clkB := testclock.New(), testclock.New()
	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Clock: clkA, Durability: Remote})
	eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clkB, Durability: Remote})
	x := openShard(t, eA, "x")
	acked := appendBatches(t, x, 2)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a liveness bound
	defer cancel()
	got := follow(fctx, x, 0)
	for range acked {
		if rec := <-got; rec.err != nil {
			t.Fatalf("A's follower: %v", rec.err)
		}
	}

	fa.SetRules(fault.Rule{Err: errors.New("A cut off")})
	defer fa.SetRules()
	clkA.Skip(eA.opts.Lease.Duration)
	clkB.Advance(time.Minute)
	shB, err := eB.OpenShard(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shB.Append(ctx, recs("b", 4)...); err != nil {
		t.Fatal(err)
	}
	var plain error
	for _, err := range x.Read(ctx, 0) {
		plain = err
	}
	if !errors.Is(plain, manifest.ErrFenced) {
		t.Fatalf("A's plain read ended with %v, want ErrFenced", plain)
	}

	bound := 5 * time.Second // five rechecks of a waiting follower
	select {
	case rec := <-got:
		if rec.err == nil {
			t.Fatalf("A's follower yielded %q at %d after B took x over", rec.Value, rec.Offset)
		}
		t.Logf("A's follower ended: %v", rec.err)
	case <-time.After(bound):
		t.Fatalf("A's follower still waits %s after B took x over and acknowledged records, A's lease lapsed", bound)
	}
}
