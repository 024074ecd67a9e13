package ownership

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
)

// flushUntil retries st.Flush (the copier retries every second) until it returns
// nil or ErrDiverged, or 10 s passed; it returns the last error.
func flushUntil(t *testing.T, st *Store) error {
	t.Helper()
	ctx := context.Background()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = st.Flush(ctx); err == nil || errors.Is(err, manifest.ErrDiverged) {
			return err
		}
	}
	return err
}

// TestADivergedReplicaIsNeverOverwrittenByALaterEpochOfAnotherAuthority: guarantee
// "a replica that holds another owner's manifest of the same epoch ... the copy
// leaves the replica as it is (ErrDiverged, logged) for an operator to decide"
// and "a copy never moves a replica back".
//
// The ErrDiverged check only compares equal epochs. Once the authority's lineage
// moves one epoch past the other lineage's, newer() calls the authority's manifest
// newer and the copy swaps it in over the other history.
//
// Interleaving: exactly TestACopyNeverOverwritesAnotherOwnersManifestOfTheSameEpoch
// (A epoch 1 on authority a, its copies to b refused, renewed to seq 5; C
// cold-opens from b alone, takes epoch 1 there and commits two parts, seq 3,
// sealed 8; b comes back and A's copy finds C's manifest: ErrDiverged, b left
// alone). Then the ordinary next step on the
// authority's side: A's shard is closed and reopened (Release, Acquire: epoch 2 on
// a). Its copy compares (2, seq) with C's (1, 3): "newer", swaps it in. b's
// manifest now names A at epoch 2 with sealed 0: C's two committed parts (whose
// records C truncated from its WAL) are gone from the only manifest that named
// them, with no ErrDiverged, and C's next renewal is fenced by a lineage it never
// lost a takeover to. The "operator decides" window lasted one takeover.
func TestADivergedReplicaIsNeverOverwrittenByALaterEpochOfAnotherAuthority(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	bFromA := fault.Wrap(bDrv, 1)
	stA := NewStore(bucket(t, "a", aDrv), bucket(t, "b", bFromA))
	t.Cleanup(stA.Close)
	bFromA.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Err: errors.New("b unreachable from A")})
	a := acquire(t, stA)

	// A renews first (its copies fail on an empty b), so that no copy of A's ever
	// meets C's manifest with a sequence at or below C's (the third test shows
	// what that does).
	renew(t, a, 4)
	time.Sleep(50 * time.Millisecond)
	c := coldOpen(t, bDrv, LeaseOptions{}, part(0, 4), part(4, 4))
	bFromA.SetRules()
	if err := flushUntil(t, stA); !errors.Is(err, manifest.ErrDiverged) {
		t.Fatalf("A's copy to b: %v, want ErrDiverged (the same-epoch case is caught)", err)
	}

	// A's engine closes the shard and opens it again: epoch 2 on the authority.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a2, _, err := Acquire(ctx, stA, "s", instance(t, stA, "A", LeaseOptions{}), LeaseOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ferr := flushUntil(t, stA)
	m, err := manifest.LoadFrom(ctx, bucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	cerr := c.Confirm(ctx)
	if m.Owner != "C" || m.Sealed != 8 {
		t.Fatalf("after A's next takeover (epoch %d on a), its copy replaced C's diverged history on b (Flush: %v): b holds owner %q epoch %d seq %d sealed %d with %d parts; C committed parts through 8 there; C's next renewal: %v",
			a2.Epoch(), ferr, m.Owner, m.Epoch, m.Seq, m.Sealed, len(m.Parts), cerr)
	}
}

// TestAReplicaAheadInAnotherHistoryIsReportedDiverged: guarantee
// "Shard.Close waits for its release to reach every replica ... so a cold open
// from any of them starts where this owner stopped" and ErrDiverged "logged, for
// an operator to decide".
//
// Interleaving: A owns s on authority a at epoch 1; its copy to b lands (b: A,
// epoch 1, lease live). Then A's manifest writes to b fail. C cold-opens from b
// alone after A's lease there has run out by C's clock (b only has A's old
// renewal), takes epoch 2 on b and commits two parts. A keeps renewing at epoch 1
// and commits a part of its own. b comes back: A's copy finds (2, C), calls it "a
// newer owner's" and reports the copy landed. A's Release and WaitCopies (what
// Shard.Close does) return nil: the handover is reported complete, while b holds
// none of A's commit and another lineage's history, and nothing says so (no
// ErrDiverged, the case is not even logged).
func TestAReplicaAheadInAnotherHistoryIsReportedDiverged(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	bFromA := fault.Wrap(bDrv, 1)
	stA := NewStore(bucket(t, "a", aDrv), bucket(t, "b", bFromA))
	t.Cleanup(stA.Close)
	a := acquire(t, stA)
	if err := stA.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	bFromA.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Err: errors.New("b unreachable from A")})

	later := testclock.NewAt(time.Now().Add(time.Hour)) // A's lease on b has run out
	coldOpen(t, bDrv, LeaseOptions{Clock: later}, part(0, 4), part(4, 4))
	if err := a.Commit(ctx, part(0, 2)); err != nil {
		t.Fatal(err)
	}
	renew(t, a, 4)
	bFromA.SetRules()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	werr := a.WaitCopies(wctx)
	m, err := manifest.LoadFrom(ctx, bucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	if werr == nil && (m.Owner != "A" || !m.Released) {
		t.Fatalf("A's release (epoch %d, seq %d, sealed 2) was reported on every replica (WaitCopies: nil), but b holds another lineage: owner %q epoch %d seq %d sealed %d released %v; a cold open from b would not start where A stopped, and no ErrDiverged was reported",
			a.Epoch(), a.Manifest().Seq, m.Owner, m.Epoch, m.Seq, m.Sealed, m.Released)
	}
}

// TestADelayedCopyNeverAdoptsAnotherHistorysVersion:
// guarantee "a replica that holds another owner's manifest of the same epoch was
// used as an authority of its own ... the copy leaves the replica as it is
// (ErrDiverged)". This is also why
// TestACopyNeverOverwritesAnotherOwnersManifestOfTheSameEpoch used to fail now and then
// ("A's copy to b: <nil>, want ErrDiverged": about 1 run in 50 with -count=200).
//
// copier.copy checks "!newer(m, cur)" before the same-epoch-different-owner check,
// and on that path returns curVer, which the copier keeps as the replica's version.
// An older copy of A's (a lower seq than C's manifest at the same epoch) arriving
// after C wrote therefore takes C's manifest for "ours, or a newer owner's",
// caches C's version, and A's next copy is a compare-and-swap on C's version that
// succeeds without reading b: C's history is overwritten, no ErrDiverged.
//
// Interleaving (deterministic, by latency only, no failures): A takes s on a at
// epoch 1; its copies to b take 300 ms, so its first copy (seq 1) is in flight.
// C cold-opens from b alone, takes epoch 1 there and commits two parts (seq 3,
// sealed 8). A renews 4 times on a (seq 5). A's seq-1 put-if-absent reaches b,
// finds C's seq 3, "not newer": landed, version = C's. The copy of seq 5 then
// swaps on C's version: b names A, sealed 0.
func TestADelayedCopyNeverAdoptsAnotherHistorysVersion(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	bFromA := fault.Wrap(bDrv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Latency: 300 * time.Millisecond})
	stA := NewStore(bucket(t, "a", aDrv), bucket(t, "b", bFromA))
	t.Cleanup(stA.Close)
	a := acquire(t, stA)      // its copy of seq 1 is on its way to b
	for bFromA.Calls() == 0 { // the seq-1 put-if-absent is in its latency
		time.Sleep(time.Millisecond)
	}

	c := coldOpen(t, bDrv, LeaseOptions{}, part(0, 4), part(4, 4))
	renew(t, a, 4)
	ferr := flushUntil(t, stA)
	m, err := manifest.LoadFrom(ctx, bucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	cerr := c.Confirm(ctx)
	if m.Owner != "C" || m.Sealed != 8 || !errors.Is(ferr, manifest.ErrDiverged) {
		t.Fatalf("A's copies (epoch %d, another lineage) vs C's manifest on b: Flush %v; b holds owner %q epoch %d seq %d sealed %d with %d parts (C committed through 8); C's next renewal: %v",
			a.Epoch(), ferr, m.Owner, m.Epoch, m.Seq, m.Sealed, len(m.Parts), cerr)
	}
}
