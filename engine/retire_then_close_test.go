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
// ship. The caller retires y (a lag move, or a fleet drain past its deadline): the
// retire fails and keeps y's lease, since its pages are not shipped. The caller
// then closes the engine, the tail still down, with no shard open: Close must keep
// the instance lease y's lease is held under (pages are unshipped), so that
// machine B cannot open y at once and read none of A's acknowledged records.
func TestACloseAfterARetireThatKeptItsLeaseKeepsTheInstanceLease(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	clk := testclock.New() // one clock: A's lease is live for B until released
	short := manifest.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(),
		Durability: Local, Clock: clk, Lease: short, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clk, Lease: short, RenewEvery: time.Second}

	eA := open(t, optsA)
	y := openShard(t, eA, "y")
	acked := appendBatches(t, y, 10)
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	err := y.Retire(rctx)
	cancel()
	if err == nil {
		t.Fatal("y's retire succeeded with its tail down")
	}
	t.Logf("y's retire: %v", err)
	t.Logf("A's close: %v", eA.Close())

	eB := open(t, optsB)
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sh, err := eB.OpenShard(octx, "y")
	if err != nil {
		t.Logf("B's open of y: %v (held: as it should be)", err)
		return
	}
	if got := readAll(t, sh, 0); !equal(got, acked) {
		t.Fatalf("A acknowledged %d records of y in Local mode; y's retire kept its lease, then A's Close released the instance lease; B opened y at once and its y holds %d of them", len(acked), countIn(got, acked))
	}
}
