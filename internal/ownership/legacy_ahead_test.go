package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate/mem"
)

// TestALegacyReplicaAheadOfTheUpgradedHistoryIsReportedDiverged: guarantee "A
// manifest written before authorities were recorded names none: the first
// takeover on an upgraded engine records it as its fork point, so an old
// manifest ahead of it is another history too. Otherwise the histories
// diverged ... (ErrDiverged)" and "Shard.Close waits for its release to reach
// every replica (and returns an error saying which did not)".
//
// copier.copy asks cur.descends(m) first. With cur a legacy manifest (Authority
// ""), descends' first case is "a.Authority == m.Authority || m.Authority == ”"
// with the receiver cur as m: a receiver that names no authority compares by
// (epoch, seq) alone, so any upgraded manifest whose epoch is at or below the
// legacy copy's counts as "a newer manifest of this history holds the replica":
// the copy returns landed = m.Seq, nil. No ErrDiverged, WaitCopies/Flush return
// nil, and the replica keeps the other (legacy) history, while the owner is told
// every replica holds its manifest.
//
// Interleaving (deterministic), the same authority name before and after the
// upgrade: in the legacy era a cold open from b alone forked b's history (the
// reason authorities were introduced): a holds A's legacy (epoch 1, seq 3,
// sealed 4, released), b holds C's legacy (epoch 2, seq 5, sealed 8, released;
// part 4-8 is C's own). The upgraded engine X (authority a, replica b) takes the
// shard over: (a, fork {"", 1, 3}, epoch 2, seq 4), and releases: seq 5. Its
// copies to b find C's (2, 5, ""): b is C's history, ahead of X's fork point,
// so ErrDiverged is due; instead both copies "land" and Flush says nil.
func TestALegacyReplicaAheadOfTheUpgradedHistoryIsReportedDiverged(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	a, b := bucket(t, "a", aDrv), bucket(t, "b", bDrv)
	legacyA := manifest.Manifest{Shard: "s", Epoch: 1, Seq: 3, Owner: "A", Released: true, Sealed: 4, Parts: []manifest.Part{part(0, 4)}}
	putManifest(t, a, legacyA)
	legacyC := manifest.Manifest{Shard: "s", Epoch: 2, Seq: 5, Owner: "C", Released: true, Sealed: 8, Parts: []manifest.Part{part(0, 4), part(4, 4)}}
	putManifest(t, b, legacyC)

	st := NewStore(bucket(t, "a", aDrv), bucket(t, "b", bDrv))
	t.Cleanup(st.Close)
	o, _, err := Acquire(ctx, st, "s", instance(t, st, "X", LeaseOptions{}), LeaseOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	werr := o.WaitCopies(wctx)
	ferr := flushUntil(t, st)
	m, err := manifest.LoadFrom(ctx, b, "s")
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(werr, manifest.ErrDiverged) || !errors.Is(ferr, manifest.ErrDiverged) {
		t.Fatalf("X (authority %q, fork %+v, epoch %d seq %d) released; b holds the legacy history of %q (epoch %d seq %d sealed %d, authority %q), ahead of X's fork point: want ErrDiverged, got WaitCopies: %v, Flush: %v (the copy took the legacy manifest for a newer one of X's own history)",
			o.Manifest().Authority, o.Manifest().Fork, o.Epoch(), o.Manifest().Seq, m.Owner, m.Epoch, m.Seq, m.Sealed, m.Authority, werr, ferr)
	}
}
