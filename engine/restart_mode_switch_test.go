package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// Machine A, in Local mode, acknowledges 40 records of y that its tail cannot
// ship; its Close keeps the instance lease (y's retire failed). A restarts on the
// same Dir in Remote mode: the new lease carries the old token and keeps y as an
// orphan, whose records were acknowledged under Local mode. It opens
// another shard, z, and closes again before any renewal (so before the orphan pass
// ran): with y not given back, the Close must keep the instance lease, so that
// machine B cannot take y at once and read a history without A's records.
func TestARestartInRemoteModeClosedBeforeItsOrphanPassKeepsALocalModeShard(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	clk := testclock.New() // never advanced: no renewal, so no orphan pass
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(),
		Durability: Local, Clock: clk, Lease: manifest.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clk}

	eA := open(t, optsA)
	acked := appendBatches(t, openShard(t, eA, "y"), 10)
	err := eA.Close()
	t.Logf("A's close, its tail unshipped: %v", err)
	fa.SetRules()

	optsA2 := optsA
	optsA2.Durability = Remote
	eA2 := open(t, optsA2)
	if err := openShard(t, eA2, "z").Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := eA2.Close(); err != nil {
		t.Fatalf("A's second close: %v", err)
	}

	eB := open(t, optsB)
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sh, err := eB.OpenShard(octx, "y")
	if err != nil {
		t.Logf("B's open of y: %v (held: as it should be)", err)
		return
	}
	if got := readAll(t, sh, 0); !equal(got, acked) {
		t.Fatalf("A acknowledged %d records of y in Local mode; its restarted engine closed before its orphan pass and released the instance lease; B opened y at once and its y holds %d of them", len(acked), countIn(got, acked))
	}
}
