package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// A (Local mode) owns x and dies unreleased. C restarts on A's Dir: its lease
// has a new token carrying A's; x is still C's orphan (no renewal yet, so no
// orphan pass), its manifest naming A's token. C opens y (its manifest names C's
// token) and appends. The instance lease object is deleted (an operator, a
// lifecycle rule). Machine D tries x: its manifest names the carried token, the
// object is gone, so D writes a stand-in under that token (without the carried
// list). D then tries y: a stand-in knows one token of the holder's, not which
// others its record held, so it must hold them all: y is not free while C's lease
// is valid and C acknowledges appends.
func TestAStandInUnderACarriedTokenDoesNotFreeTheLiveEnginesShards(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New() // never advanced: no renewal of C's, no orphan pass
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	short := lateLease
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(),
		Durability: Local, Clock: clk, Lease: short, RenewEvery: time.Second}
	eA := open(t, optsA)
	appendBatches(t, openShard(t, eA, "x"), 2)
	refuseShardWrites(fa)
	t.Logf("A's machine lost (its Close fails): %v", eA.Close())
	fa.SetRules()

	optsC := optsA
	optsC.Bucket = substratetest.NewBucket(t, "shared", drv)
	eC := open(t, optsC)
	yC := openShard(t, eC, "y")
	acked := appendBatches(t, yC, 2)

	if err := eC.Authority().Delete(ctx, lease.InstanceKey(eC.Instance())); err != nil {
		t.Fatal(err)
	}
	optsD := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clk, Lease: short, RenewEvery: time.Second}
	eD := open(t, optsD)
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := eD.OpenShard(octx, "x")
	t.Logf("D's open of x (owned under C's carried token): %v", err)
	rec, _, _ := lease.Read(ctx, eC.Authority(), lease.InstanceKey(eC.Instance()))
	t.Logf("the lease object now: token %s carried %v (C's token %s)", rec.Token, rec.Carried, eC.heldLease().Token())

	yD, err := eD.OpenShard(octx, "y")
	if err != nil {
		t.Logf("D's open of y: %v (held: as it should be)", err)
		return
	}
	_, validC := eC.heldLease().Valid()
	offC, errC := yC.Append(ctx, []byte("C's, after D took y"))
	got := readAll(t, yD, 0)
	t.Fatalf("D opened y, owned by C under C's own token while C's lease is valid (%v), after a stand-in under C's carried token was written; D's y holds %d of C's %d acknowledged records; C's append after it: offset %d, err %v", validC, countIn(got, acked), len(acked), offC, errC)
}

// A owns y and w; its Dir was backed up before it took w. A dies unreleased, and
// the backup is restored on C, whose WAL knows y, not w. C opens y; its orphans
// settled, C lets A's token go (Uncarry), so that w is free. The instance lease
// object is deleted (an operator, a lifecycle rule); D tries w, whose manifest
// names the token C let go, finds the object gone and writes a stand-in under
// that token. C's next renewal must take the stand-in of its own instance for
// what it is, a write-back of the deleted object, and write over it: nobody took
// C's lease, and none of its shards may be fenced.
func TestAStandInUnderALetGoTokenDoesNotCostTheLiveEngineItsLease(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	short := LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}
	dirA := t.TempDir()
	optsA := Options{Dir: dirA, Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Clock: clk, Lease: short, RenewEvery: time.Second}
	eA := open(t, optsA)
	openShard(t, eA, "y")
	backup := filepath.Join(t.TempDir(), "backup")
	copyLiveDir(t, backup, dirA)
	appendBatches(t, openShard(t, eA, "w"), 2)
	refuseShardWrites(fa)
	t.Logf("A's machine lost (its Close fails): %v", eA.Close())
	fa.SetRules()

	optsC := optsA
	optsC.Dir = backup
	optsC.Bucket = substratetest.NewBucket(t, "shared", drv)
	eC := open(t, optsC)
	yC := openShard(t, eC, "y")
	h := eC.heldLease()
	clk.Advance(time.Second) // C's renewal, then its orphan pass and the uncarry
	waitFor(t, 5*time.Second, "C lets A's token go", func() bool { return !h.Carries() })

	if err := eC.Authority().Delete(ctx, lease.InstanceKey(eC.Instance())); err != nil {
		t.Fatal(err)
	}
	optsD := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clk, Lease: short, RenewEvery: time.Second}
	eD := open(t, optsD)
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := eD.OpenShard(octx, "w")
	t.Logf("D's open of w (owned under the token C let go): %v", err)

	renewed := h.Renewed()
	clk.Advance(time.Second) // C's next renewal
	waitFor(t, 5*time.Second, "C's next renewal", func() bool {
		_, err := h.Valid()
		return h.Renewed() != renewed || err != nil
	})
	if _, err := h.Valid(); err != nil {
		_, aerr := yC.Append(ctx, []byte("C's"))
		t.Fatalf("C's instance lease, which no one took, is gone after a reader wrote back a stand-in under the token C let go: %v; C's append to y: %v", err, aerr)
	}
}
