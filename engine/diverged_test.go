package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestACopyNeverOverwritesALiveHistoryThatAcknowledgedRecords: guarantee "If
// that history committed nothing the copy lacks (its parts are a prefix of the
// copy's: a cold read, say), the copy overwrites it and loses nothing" (DESIGN 7,
// commit 7e88ac1), and the engine's first one: an acknowledged append is durable.
//
// partsPrefix looks only at the diverged manifest's parts. A cold open that took
// the shard over on the replica and is *live* has committed no part yet, but has
// acknowledged appends: they are in its WAL, to be sealed and committed on its
// authority (the replica). The copy from the other history overwrites its
// manifest ("loses nothing"), which fences that owner at its next write: its
// seal's commit is refused, Shard.Close fails with ErrFenced, and the records it
// acknowledged are in no manifest; the next open on its Dir finds the shard owned
// by another instance since and drops them as superseded. Before 7e88ac1 the copy
// was refused with ErrDiverged and the replica kept the live history for an
// operator to decide.
//
// Interleaving (deterministic): engine A, replicas a (authority) and b, opens
// "s"; its manifest writes to b fail. Engine C, on its own Dir with b alone (a
// cold open, e.g. a DR drill or a split), opens "s" on b and acknowledges 3
// batches (12 records). b becomes reachable from A again; A's copier retries (1 s) and finds
// C's manifest on b: another authority, not A's past, but no parts: overwritten.
// C's Shard.Close seals the 3 records and commits: fenced.
func TestACopyNeverOverwritesALiveHistoryThatAcknowledgedRecords(t *testing.T) {
	ctx := context.Background()
	bDrv := mem.New()
	bFromA := fault.Wrap(bDrv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Err: errors.New("b unreachable from A")})
	eA := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", nil)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bFromA)}},
		Authority: "a", Seal: quietSealOptions()})
	openShard(t, eA, "s")

	eC := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "b", bDrv), Seal: quietSealOptions()})
	shC := openShard(t, eC, "s")
	acked := appendBatches(t, shC, 3)

	bFromA.SetRules()
	b := substratetest.NewBucket(t, "b", bDrv)
	// A's copier retries every second: give it a few tries (refused with
	// ErrDiverged, b keeps C's manifest, as before 7e88ac1; or it lands).
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m, err := manifest.LoadFrom(ctx, b, "s"); err == nil && m.Owner == eA.Instance() {
			break
		}
	}
	cerr := shC.Close(ctx)
	m, err := manifest.LoadFrom(ctx, b, "s")
	if err != nil {
		t.Fatal(err)
	}
	if cerr != nil || m.Sealed < uint64(len(acked)) {
		t.Fatalf("C acknowledged %d records of s on its authority b; A's copy (another history, no parts) overwrote C's live manifest there as one that \"committed nothing\": C's Shard.Close: %v; b now holds owner %q authority %q epoch %d sealed %d: C's acknowledged records are in no manifest",
			len(acked), cerr, m.Owner, m.Authority, m.Epoch, m.Sealed)
	}
}
