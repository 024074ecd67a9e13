package ownership

import (
	"context"
	"testing"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// putManifest writes m on b as is (a manifest an earlier binary, or an earlier
// phase of the test, left there).
func putManifest(t *testing.T, b *substrate.Bucket, m manifest.Manifest) {
	t.Helper()
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PutBytes(context.Background(), manifest.Key(m.Shard), data); err != nil {
		t.Fatal(err)
	}
}

// TestALegacyManifestAheadOfAForkIsNeverOverwritten: guarantee "A copy overwrites
// a replica's manifest only if it is in the copy's past ... one that holds any
// other history ... the histories diverged ... the copy leaves it as it is
// (ErrDiverged)", for shards whose manifests were written before
// authorities were recorded (Authority "").
//
// descends treats a manifest of no recorded authority as one of m's own
// authority ("a is of m's authority (or of none recorded) and not newer"), and
// Acquire records no Fork when the manifest it replaces names no authority. So a
// takeover that starts from a *lagging* legacy copy on another bucket (a planned
// move of the authority after a crash, or a cold open with the old authority in
// the set) is indistinguishable from "the same history, later": its copy to the
// old authority compares epochs only and overwrites the old authority's newer
// legacy manifest. With recorded authorities the same interleaving is caught
// (Fork{a, 1, 2} < a's seq 3: ErrDiverged); with a legacy shard it is silent.
//
// Interleaving (deterministic): a holds the legacy manifest of A, epoch 1, seq
// 3, sealed 8 (parts 0-4, 4-8); b holds a's legacy copy of seq 2, sealed 4 (the
// copy of the last commit never landed: A crashed, or b was down). The upgraded
// engine is configured with b as the authority and a as a replica, and takes the
// shard over: (b, epoch 2, seq 3, sealed 4, no fork). Its copy to a finds a's
// legacy (1, 3, sealed 8): "" => descends by epoch => compare-and-swap. a now
// says sealed 4: the part 4-8, whose records A truncated from its WAL, is named
// by no manifest anywhere, and no ErrDiverged was reported.
func TestALegacyManifestAheadOfAForkIsNeverOverwritten(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	a, b := bucket(t, "a", aDrv), bucket(t, "b", bDrv)
	legacy := manifest.Manifest{Shard: "s", Epoch: 1, Seq: 3, Owner: "A", Released: true, Sealed: 8, Parts: []manifest.Part{part(0, 4), part(4, 4)}}
	putManifest(t, a, legacy)
	lag := legacy.Clone()
	lag.Seq, lag.Sealed, lag.Parts, lag.Released = 2, 4, lag.Parts[:1], false
	putManifest(t, b, lag)

	st := NewStore(bucket(t, "b", bDrv), bucket(t, "a", aDrv))
	t.Cleanup(st.Close)
	o, prev, err := Acquire(ctx, st, "s", instance(t, st, "X", LeaseOptions{}), LeaseOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ferr := flushUntil(t, st)
	m, err := manifest.LoadFrom(ctx, a, "s")
	if err != nil {
		t.Fatal(err)
	}
	if m.Sealed != 8 {
		t.Fatalf("the takeover from b's lagging legacy copy (prev seq %d sealed %d; new: authority %q fork %v epoch %d) was copied over a's newer legacy manifest (seq 3, sealed 8): a now holds owner %q epoch %d seq %d sealed %d, Flush: %v; part 4-8 is named by no manifest",
			prev.Seq, prev.Sealed, o.Manifest().Authority, o.Manifest().Fork, o.Epoch(), m.Owner, m.Epoch, m.Seq, m.Sealed, ferr)
	}
}
