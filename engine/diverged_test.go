package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestACopyNeverOverwritesALiveHistoryThatAcknowledgedRecords: guarantee "If
// that history committed nothing the copy lacks (its parts are a prefix of the
// copy's: a cold read, say), the copy overwrites it and loses nothing", and the
// engine's first one: an acknowledged append is durable.
//
// partsPrefix looks only at the diverged manifest's parts. A cold open that took
// the shard over on the replica and is *live* has committed no part yet, but has
// acknowledged appends: they are in its WAL, to be sealed and committed on its
// authority (the replica). The copy from the other history overwrites its
// manifest ("loses nothing"), which fences that owner at its next write: its
// seal's commit is refused, Shard.Close fails with ErrFenced, and the records it
// acknowledged are in no manifest; the next open on its Dir finds the shard owned
// by another instance since and drops them as superseded. Before that fix the copy
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
	bDrv, bFromA, eA := unreachableFromA(t)
	openShard(t, eA, "s")

	eC := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "b", bDrv), Seal: quietSealOptions()})
	shC := openShard(t, eC, "s")
	acked := appendBatches(t, shC, 3)

	bFromA.SetRules()
	b := substratetest.NewBucket(t, "b", bDrv)
	// A's copier retries every second: give it a few tries (refused with
	// ErrDiverged, b keeps C's manifest; or it lands).
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

// unreachableFromA opens engine A over replicas a (its authority) and b, whose
// manifest writes from A fail until bFromA's rules are cleared; bDrv is b's
// driver, for engines that reach it.
func unreachableFromA(t *testing.T) (bDrv *mem.Driver, bFromA *fault.Driver, eA *Engine) {
	bDrv = mem.New()
	bFromA = fault.Wrap(bDrv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Err: errors.New("b unreachable from A")})
	eA = open(t, replicated(t, substratetest.NewBucket(t, "a", nil), substratetest.NewBucket(t, "b", bFromA)))
	return bDrv, bFromA, eA
}

// TestACopyNeverOverwritesARetiredHistoryThatAcknowledgedRecords: guarantee "If
// that history is released and committed nothing the copy lacks (its parts are a
// prefix of the copy's: a cold read, say), the copy overwrites it and loses
// nothing", and the engine's first one: an
// acknowledged append is durable.
//
// An earlier fix made the overwrite wait for cur.Released, on the premise that a
// released history has sealed what it acknowledged. Shard.Retire, which
// Engine.Close runs on every shard still open, releases *without sealing*: its
// acknowledged records stay in the owner's WAL, for "the next open on this
// engine's directory" to seal. The copy from the other history finds a released
// manifest with no parts (a prefix of anything) and overwrites it. The next open
// on C's Dir then reads a manifest naming A, not C: C's pages are "superseded"
// and dropped as stranded, although no owner ever took over from C.
//
// Interleaving (deterministic): engine A, replicas a (authority) and b, opens
// "s"; its manifest writes to b fail. Engine C, on its own Dir with b alone (a
// cold open), opens "s" on b and acknowledges 3 batches (12 records), then
// Engine.Close (Retire: released, nothing sealed). b becomes reachable from A
// again; A's copier retries (1 s) and finds C's released manifest with no parts:
// overwritten. A closes its shard (released). C's engine reopens on the same Dir and bucket and opens "s": the
// 12 acknowledged records are gone.
func TestACopyNeverOverwritesARetiredHistoryThatAcknowledgedRecords(t *testing.T) {
	ctx := context.Background()
	bDrv, bFromA, eA := unreachableFromA(t)
	shA := openShard(t, eA, "s")

	dirC := t.TempDir()
	optsC := Options{Dir: dirC, Bucket: substratetest.NewBucket(t, "b", bDrv), Seal: quietSealOptions()}
	eC := open(t, optsC)
	shC := openShard(t, eC, "s")
	acked := appendBatches(t, shC, 3)
	if err := eC.Close(); err != nil { // retires "s": released, the 12 records unsealed in C's WAL
		t.Fatal(err)
	}

	bFromA.SetRules()
	b := substratetest.NewBucket(t, "b", bDrv)
	overwritten := false
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m, err := manifest.LoadFrom(ctx, b, "s"); err == nil && m.Owner == eA.Instance() {
			overwritten = true
			break
		}
	}

	// A hands the shard over (a cooperative close of its own history); b keeps
	// C's, and A's Close says its release did not reach b.
	if err := shA.Close(ctx); err != nil && !errors.Is(err, manifest.ErrDiverged) {
		t.Fatal(err)
	}

	eC2 := open(t, optsC)
	sh, err := eC2.OpenShard(ctx, "s")
	if err != nil {
		t.Fatalf("C's reopen on its Dir (A's copy overwrote b: %v): %v", overwritten, err)
	}
	got := readAll(t, sh, 0)
	if len(got) != len(acked) {
		t.Fatalf("C acknowledged %d records of s on its authority b and retired it (released, unsealed, for its next open to seal); A's copy of another history overwrote C's released manifest on b as one that \"committed nothing\" (overwritten: %v); C's reopen reads %d records (stranded: %v)",
			len(acked), overwritten, len(got), eC2.Metrics().StrandedRecords)
	}
}

// TestAnOverwrittenColdReadNeverLocksItsDirOutOfTheShard: guarantee "If that
// history is released and committed nothing the copy lacks ..., the copy
// overwrites it and loses nothing" against "A WAL whose epoch is
// *ahead* of the manifest's (the wrong bucket, or a bucket that lost its
// manifest) refuses the open (ErrManifestBehind)" ("Which pages an open
// inherits").
//
// The overwrite loses the epochs the other history took. Every takeover
// records its epoch in the WAL of the engine that took it; after the copy
// replaced the replica's manifest with one of a lower epoch, the engine that did
// the cold reads finds its WAL "ahead" of the very bucket it used all along, and
// is refused with ErrManifestBehind (a WAL holding nothing: every cold read
// closed cleanly), until the other history happens to pass its epoch.
//
// Interleaving (deterministic): engine A (authority a, replica b) opens and
// closes "s": (a, epoch 1, released) on a and b. Engine B, on its own Dir with b
// alone, opens and closes "s" three times (cold reads, nothing appended):
// (b, fork {a,1,2}, epoch 4, released) on b, B's WAL at epoch 4. A opens "s"
// again: (a, epoch 2); its copy finds B's released manifest with no parts of its
// own: overwritten; A closes "s". B opens "s" on b: WAL epoch 4, manifest epoch 2.
func TestAnOverwrittenColdReadNeverLocksItsDirOutOfTheShard(t *testing.T) {
	ctx := context.Background()
	bDrv := mem.New()
	eA := open(t, replicated(t, substratetest.NewBucket(t, "a", nil), substratetest.NewBucket(t, "b", bDrv)))
	if err := openShard(t, eA, "s").Close(ctx); err != nil {
		t.Fatal(err)
	}

	eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "b", bDrv), Seal: quietSealOptions()})
	for range 3 {
		if err := openShard(t, eB, "s").Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	shA := openShard(t, eA, "s")
	if err := shA.Close(ctx); err != nil && !errors.Is(err, manifest.ErrDiverged) {
		t.Fatalf("A's close (its copy to b over B's released cold reads): %v", err)
	}
	m, err := manifest.LoadFrom(ctx, substratetest.NewBucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}

	sh, err := eB.OpenShard(ctx, "s")
	if err != nil {
		t.Fatalf("B cold-read s on b three times (epochs 2-4, each closed cleanly, nothing appended); A's copy overwrote b with (authority %q epoch %d seq %d owner %q released %v) as a history that \"loses nothing\"; B's next open on the same bucket: %v (ErrManifestBehind: %v)",
			m.Authority, m.Epoch, m.Seq, m.Owner, m.Released, err, errors.Is(err, ErrManifestBehind))
	}
	sh.Close(ctx)
}
