package engine

import (
	"context"
	"errors"
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
	copyLiveDir(t, backup, dirA)
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

// TestARestoredDirReadsWhatTheOriginalAcknowledgedAfterTheCopy: A's Dir is
// backed up while y holds 8 records; A then acknowledges 8 more and is lost
// (its Close cannot release: the store refuses its shard writes), or closes
// cleanly. The backup is restored on machine C, which opens y: the manifest names
// C's own instance at the WAL's epoch, but the WAL holds only what it held at the
// copy. C follows its instance's chain and reads the rest from the tail: every
// record A acknowledged is in y at its offset, and C's next record goes after
// them.
func TestARestoredDirReadsWhatTheOriginalAcknowledgedAfterTheCopy(t *testing.T) {
	for _, lost := range []bool{true, false} {
		name := map[bool]string{true: "machine lost", false: "clean close"}[lost]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			drv := mem.New()
			fa := fault.Wrap(drv, 1)
			dirA := t.TempDir()
			optsA := Options{Dir: dirA, Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
			eA := open(t, optsA)
			y := openShard(t, eA, "y")
			want := appendBatches(t, y, 2)
			backup := filepath.Join(t.TempDir(), "backup")
			copyLiveDir(t, backup, dirA)
			want = append(want, appendBatches(t, y, 2)...)
			if lost {
				refuseShardWrites(fa)
			}
			t.Logf("A's close: %v", eA.Close())
			fa.SetRules()

			optsC := optsA
			optsC.Dir = backup
			optsC.Bucket = substratetest.NewBucket(t, "shared", drv)
			eC := open(t, optsC)
			shC, err := eC.OpenShard(ctx, "y", WaitForLease())
			if err != nil {
				t.Fatalf("C's open of y: %v", err)
			}
			got := readAll(t, shC, 0)
			if !equal(got, want) {
				t.Fatalf("C, on A's Dir restored from a copy, reads %d records of y; A acknowledged %d", len(got), len(want))
			}
			off, err := shC.Append(ctx, []byte("C's own"))
			if err != nil || off != uint64(len(want)) {
				t.Fatalf("C's own record at %d (%v), want %d", off, err, len(want))
			}
		})
	}
}
