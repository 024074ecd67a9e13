package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// TestACopyNeverOverwritesAnotherOwnersManifestOfTheSameEpoch: guarantee "a copy
// never moves a replica back" and "a cold open from any one replica alone ...
// recovers every part that replica holds".
//
// Ordering manifests by (epoch, seq) alone is total only
// within one authority's lineage: epochs are unique per owner only because every
// takeover is a CAS on the same authority. A cold open from a replica alone makes
// that replica an authority of its own, and its takeovers mint epochs that the old
// lineage mints too.
//
// Interleaving: owner A takes shard s on authority a (epoch 1); its copy to the
// replica b fails (b refuses manifest writes for a while), so b holds nothing. b is
// then used alone (a disaster-recovery cold open of machine C whose set is b): C
// takes s on b at epoch 1 too, seals two parts (WAL truncated: the records are
// only in those parts now) and commits them (b: epoch 1, seq 3, sealed 8). A keeps
// renewing on a (epoch 1, seq 5). b comes back; A's copier finds C's manifest
// there, compares (1,5) with (1,3), used to call its own "newer" and swap it in: b's
// manifest now names A, sealed 0. C's two committed parts are gone from the only
// manifest that named them (their records were acknowledged and truncated from
// C's WAL); C's next write is fenced by "owner A at epoch 1", a manifest C never
// lost a takeover to.
func TestACopyNeverOverwritesAnotherOwnersManifestOfTheSameEpoch(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	bFromA := fault.Wrap(bDrv, 1)
	stA := NewStore(bucket(t, "a", aDrv), bucket(t, "b", bFromA))
	t.Cleanup(stA.Close)
	bFromA.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Err: errors.New("b unreachable from A")})
	a := acquire(t, stA) // epoch 1 on a; its copy to b fails and is retried every second

	// C: a cold open from b alone; b is C's authority.
	c := coldOpen(t, bDrv, LeaseOptions{}, part(0, 4), part(4, 4))
	renew(t, a, 4)
	bFromA.SetRules() // b reachable again: A's copier's retry goes through
	// A's copier retries every second; its next attempt finds C's history.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := stA.Flush(ctx)
		if errors.Is(err, manifest.ErrDiverged) {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("A's copy to b: %v, want ErrDiverged", err)
		}
	}
	m, err := manifest.LoadFrom(ctx, bucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	cerr := c.Confirm(ctx)
	if m.Owner != "C" || m.Sealed != 8 {
		t.Fatalf("C owns s on its authority b at epoch %d and committed parts through 8; A's copy (epoch %d, another lineage) replaced it: b holds owner %q epoch %d seq %d sealed %d with %d parts; C's next renewal: %v",
			c.Epoch(), a.Epoch(), m.Owner, m.Epoch, m.Seq, m.Sealed, len(m.Parts), cerr)
	}
}
