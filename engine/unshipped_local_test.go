package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// The tests here put machine A in Local mode with its tail down: its appends to
// shard y are acknowledged, fsynced on A's Dir and shipped nowhere. However A
// then retires, closes or restarts, machine B must never get y with a history
// that lacks them: while their pages are only on A's Dir, y stays A's.

// unshippedLocal is A's options (Local mode, every tail put failing until
// fa.SetRules()) and B's over the same store, both on clk (nil: the real clock).
func unshippedLocal(t *testing.T, clk clock.Clock) (fa *fault.Driver, optsA, optsB Options) {
	drv := mem.New()
	fa = fault.Wrap(drv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	short := lateLease
	optsA = Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(),
		Durability: Local, Clock: clk, Lease: short, RenewEvery: time.Second}
	optsB = Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(),
		Clock: clk, Lease: short, RenewEvery: time.Second}
	return fa, optsA, optsB
}

// bMayNotTakeYWithout opens y on B at once (no wait for A's lease): refused, or
// with every record A acknowledged; otherwise it fails with what happened.
func bMayNotTakeYWithout(t *testing.T, optsB Options, acked [][]byte, what string) {
	eB := open(t, optsB)
	octx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sh, err := eB.OpenShard(octx, "y")
	if err != nil {
		t.Logf("B's open of y: %v (held: as it should be)", err)
		return
	}
	if got := readAll(t, sh, 0); !equal(got, acked) {
		t.Fatalf("A acknowledged %d records of y in Local mode; %s; B opened y at once and its y holds %d of them", len(acked), what, countIn(got, acked))
	}
}

// The caller retires y (a lag move, or a fleet drain past its deadline): the
// retire fails and keeps y's lease, since its pages are not shipped. The caller
// then closes the engine, the tail still down, with no shard open: Close must keep
// the instance lease y's lease is held under (pages are unshipped).
func TestACloseAfterARetireThatKeptItsLeaseKeepsTheInstanceLease(t *testing.T) {
	_, optsA, optsB := unshippedLocal(t, testclock.New()) // one clock: A's lease is live for B until released
	eA := open(t, optsA)
	y := openShard(t, eA, "y")
	acked := appendBatches(t, y, 10)
	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := y.Retire(rctx)
	cancel()
	if err == nil {
		t.Fatal("y's retire succeeded with its tail down")
	}
	t.Logf("y's retire: %v", err)
	t.Logf("A's close: %v", eA.Close())
	bMayNotTakeYWithout(t, optsB, acked, "y's retire kept its lease, then A's Close released the instance lease")
}

// A's Close keeps the instance lease (y's retire failed). A restarts on the same
// Dir, in Local mode or in Remote mode: the new lease carries the old token and
// keeps y as an orphan. It opens another shard, z, and closes again before any
// renewal (so before the orphan pass ran): with y not given back, that Close must
// keep the instance lease too, whatever the restarted engine's mode (y's records
// were acknowledged under Local mode).
func TestARestartClosedBeforeItsOrphanPassKeepsTheUnshippedShard(t *testing.T) {
	for _, mode := range []Durability{Local, Remote} {
		t.Run(mode.String(), func(t *testing.T) {
			fa, optsA, optsB := unshippedLocal(t, testclock.New()) // never advanced: no renewal, so no orphan pass
			eA := open(t, optsA)
			acked := appendBatches(t, openShard(t, eA, "y"), 10)
			t.Logf("A's close, its tail unshipped: %v", eA.Close())
			fa.SetRules()

			optsA.Durability = mode
			eA2 := open(t, optsA)
			if err := openShard(t, eA2, "z").Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := eA2.Close(); err != nil {
				t.Fatalf("A's second close: %v", err)
			}
			bMayNotTakeYWithout(t, optsB, acked, "its restarted engine ("+mode.String()+" mode) closed before its orphan pass and released the instance lease")
		})
	}
}

// A restarts on the same Dir (its disk and WAL intact: no machine is lost). The
// restarted engine takes its instance lease by opening another shard, z, and has
// not reopened y yet. Machine B then opens y, waiting for A's lease: whenever it
// gets y, y's history holds every record A acknowledged.
func TestARestartOnTheSameDirInLocalModeKeepsTheUnshippedWindow(t *testing.T) {
	fa, optsA, optsB := unshippedLocal(t, nil)
	eA := open(t, optsA)
	acked := appendBatches(t, openShard(t, eA, "y"), 10)
	t.Logf("A's close, its tail unshipped: %v", eA.Close())
	fa.SetRules()
	eA2 := open(t, optsA)
	openShard(t, eA2, "z")

	eB := open(t, optsB)
	bctx, cancel := context.WithTimeout(context.Background(), 5*optsB.Lease.Duration)
	defer cancel()
	sh, err := eB.OpenShard(bctx, "y", WaitForLease())
	if err != nil {
		t.Fatalf("B's open of y, A restarted: %v", err)
	}
	if got := readAll(t, sh, 0); !equal(got, acked) {
		t.Fatalf("A acknowledged %d records of y in Local mode and restarted on the same Dir; B's y holds %d of them", len(acked), countIn(got, acked))
	}
}

// countIn counts the records of want that got holds at their offsets.
func countIn(got, want [][]byte) int {
	n := 0
	for i, w := range want {
		if i < len(got) && string(got[i]) == string(w) {
			n++
		}
	}
	return n
}
