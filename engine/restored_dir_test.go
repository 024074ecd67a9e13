package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// A's Dir is backed up; A then takes a new shard w and appends to it. A's machine
// is lost: its Close cannot release anything (the store refuses its shard writes),
// so w's manifest names A's instance lease, unreleased. The backup is restored on
// machine C (a Dir restored from an older copy). C's lease carries A's token, but
// C's WAL does not know w: once C's orphans are settled it must let A's token go,
// so that machine D opens w rather than find it owned under C's live lease.
func TestARestoredDirLetsGoOfShardsItDoesNotKnow(t *testing.T) {
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	short := lateLease
	dirA := t.TempDir()
	optsA := Options{Dir: dirA, Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	eA := open(t, optsA)
	openShard(t, eA, "y")
	backup := filepath.Join(t.TempDir(), "backup")
	if err := os.CopyFS(backup, os.DirFS(dirA)); err != nil {
		t.Fatal(err)
	}
	appendBatches(t, openShard(t, eA, "w"), 2)
	refuseShardWrites(fa)
	t.Logf("A's machine lost (its Close fails): %v", eA.Close())
	fa.SetRules()

	optsC := optsA
	optsC.Dir = backup
	optsC.Bucket = substratetest.NewBucket(t, "shared", drv)
	eC := open(t, optsC)
	openShard(t, eC, "y")

	optsD := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	eD := open(t, optsD)
	bound := 4 * short.Duration
	deadline := time.Now().Add(bound)
	for {
		octx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := eD.OpenShard(octx, "w")
		cancel()
		if err == nil {
			return
		}
		if !errors.Is(err, ErrOwned) || time.Now().After(deadline) {
			t.Fatalf("%s after C restored A's older Dir (continuing A's lease under its token %s), D still cannot open w, which C's WAL does not know: %v", bound, eC.heldLease().Token(), err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
