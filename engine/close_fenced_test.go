package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestACloseWhileFencedInLocalModeLosesNoAcknowledgedRecord: machine A, in Local
// mode, acknowledges 40 records of y while its tail cannot be put. Machine B, whose
// clock says A's lease ran out (A's clock lags), takes x over and fences A's
// stream while A lives. A's pages meet the fence: A moves to a new incarnation,
// and cannot point y's manifest at it. A's engine closes then: y's retire cannot
// record where its shipped pages end, so the shard's lease must be kept, and the
// instance lease it is held under with it. Machine C, whose clock agrees with A's,
// then opens y: it must find the lease held, or read the 40 records; not a history
// without them. Held, the records stay claimed by A's Dir, whose next open ships
// them: after it, C reads the 40.
func TestACloseWhileFencedInLocalModeLosesNoAcknowledgedRecord(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	clkA, clkB := testclock.New(), testclock.New()
	clkB.Advance(time.Minute) // past A's 30 s lease and its skew margin
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Clock: clkA, Durability: Local}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clkB}
	optsC := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clkA}
	eA, eB := open(t, optsA), open(t, optsB)
	x, y := openShard(t, eA, "x"), openShard(t, eA, "y")
	if _, err := x.Append(ctx, recs("x", 4)...); err != nil {
		t.Fatal(err)
	}
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	acked := appendBatches(t, y, 10)
	old := eA.tail.Incarnation()
	if _, err := eB.OpenShard(ctx, "x"); err != nil { // fences A's stream
		t.Fatal(err)
	}
	// A's tail can be put again, and meets the fence; y's manifest cannot be
	// written by A.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "^shards/y/manifest$", Err: fault.ErrInjected})
	waitFor(t, 10*time.Second, "A's new incarnation", func() bool { return eA.tail.Incarnation() != old })
	if err := eA.Close(); err == nil {
		t.Fatal("A's engine closed cleanly, though y's lease could not be released with its backlog recorded")
	}
	fa.SetRules()

	eC := open(t, optsC)
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	shC, err := eC.OpenShard(octx, "y")
	if errors.Is(err, manifest.ErrOwned) {
		// The records stay claimed by A's Dir, whose next open ships them.
		t.Logf("C's open of y: %v", err)
		eA = open(t, optsA)
		if err := openShard(t, eA, "y").Retire(ctx); err != nil {
			t.Fatal(err)
		}
		if err := eA.Close(); err != nil {
			t.Fatal(err)
		}
		shC = openShard(t, eC, "y")
	} else if err != nil {
		t.Fatalf("C's open of y: %v, want it owned by A or every record", err)
	}
	if got := readAll(t, shC, 0); !holds(got, 0, acked) {
		t.Fatalf("C opened y at once and reads %d of A's %d acknowledged records", len(got), len(acked))
	}
}
