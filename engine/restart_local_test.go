package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// Machine A, in Local mode, acknowledges records of shard y that its tail cannot
// ship yet, and restarts on the same Dir (its disk and WAL intact: no machine is
// lost). The restarted engine takes its instance lease by opening another shard,
// z, and has not reopened y yet. Machine B then opens y: whenever it gets y, y's
// history holds every record A acknowledged.
func TestARestartOnTheSameDirInLocalModeKeepsTheUnshippedWindow(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	short := manifest.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(),
		Durability: Local, Lease: short, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(),
		Lease: short, RenewEvery: time.Second}

	eA := open(t, optsA)
	acked := appendBatches(t, openShard(t, eA, "y"), 10)
	err := eA.Close()
	t.Logf("A's close, its tail unshipped: %v", err)
	fa.SetRules()
	eA2 := open(t, optsA)
	openShard(t, eA2, "z")

	eB := open(t, optsB)
	bctx, cancel := context.WithTimeout(ctx, 5*short.Duration)
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
