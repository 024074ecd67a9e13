package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestTheUnshippedGaugeCountsPagesWaitingForANewIncarnation: machine A, in Local
// mode, acknowledges 40 records of y while its tail cannot be put, and the
// unshipped gauge counts them. Machine B, whose clock says A's lease ran out, takes
// x over and fences A's stream while A lives; A cannot write its chain, so its
// next incarnation cannot start. Until it does, y's records are on A's disk only,
// and the gauge, "what losing the machine loses", must still count them.
func TestTheUnshippedGaugeCountsPagesWaitingForANewIncarnation(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	clkA, clkB := testclock.New(), testclock.New()
	clkB.Advance(time.Minute) // past A's 30 s lease and its skew margin
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Clock: clkA, Durability: Local}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clkB}
	eA, eB := open(t, optsA), open(t, optsB)
	x, y := openShard(t, eA, "x"), openShard(t, eA, "y")
	if _, err := x.Append(ctx, recs("x", 4)...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "x's records shipped", func() bool { return eA.Metrics().TailUnshippedBytes == 0 })
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	var want uint64
	acked := appendBatches(t, y, 10)
	for _, r := range acked {
		want += uint64(len(r))
	}
	if got := eA.Metrics().TailUnshippedBytes; got != want {
		t.Fatalf("before the fence: l0_tail_unshipped_bytes = %d, want y's %d (what this test is about changed)", got, want)
	}
	old := eA.tail.Incarnation()
	if _, err := eB.OpenShard(ctx, "x"); err != nil { // fences A's stream
		t.Fatal(err)
	}
	injected := fa.Injected()
	// Its puts go through now, and meet the fence; its chain writes fail.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "tail-chain$", Err: fault.ErrInjected})
	waitFor(t, 10*time.Second, "A's attempts to start its next incarnation", func() bool { return fa.Injected() > injected+1 })
	if inc := eA.tail.Incarnation(); inc != old {
		t.Fatalf("A ships in incarnation %d, which its chain does not list", inc)
	}
	for i := range 5 {
		if got := eA.Metrics().TailUnshippedBytes; got < want {
			t.Fatalf("scrape %d after the fence: l0_tail_unshipped_bytes = %d, want at least y's %d waiting for the new incarnation", i, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Once the next incarnation starts, y's pages are shipped there.
	fa.SetRules()
	waitFor(t, 10*time.Second, "the gauge back at 0", func() bool { return eA.Metrics().TailUnshippedBytes == 0 })
	if got := readAll(t, y, 0); !holds(got, 0, acked) {
		t.Fatalf("y reads %d records on A, want its 40", len(got))
	}
}
