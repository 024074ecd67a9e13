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

// sameSeqRules make the owner's next write W1 land with its reply lost and its read
// back lost too (ErrUnknownOutcome: the authority now holds W1 at seq n+1, the owner
// still thinks seq n), and the write after it, W2, fail plainly without landing
// (a 503, a connection reset before the request was sent). W2 is built from the
// owner's view, so it carries seq n+1 as well; its read back finds W1's seq n+1 and
// a read back that compared sequences took that for W2's own landing; the
// bytes tell them apart.
func sameSeqRules() []fault.Rule {
	return []fault.Rule{
		{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Ambiguous: true, Err: errors.New("W1: reply lost")},
		{Ops: []substrate.Op{substrate.OpGet}, Key: "manifest$", Nth: 1, Err: errors.New("W1: read back lost")},
		{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 2, Err: errors.New("W2: 503, not applied")},
	}
}

// TestACommitIsNeverTakenForAnEarlierWriteOfTheSameSequence: guarantee "no
// two writes with the same Seq both considered landed", and Commit's own contract
// "a nil error means the part is in the authority's manifest".
//
// Interleaving: Renew (W1, seq n+1) lands, its reply and its read back are lost:
// ErrUnknownOutcome, the owner's view stays at seq n. Commit(P) (W2) is built on
// that view, so it is seq n+1 too; its CAS fails without landing; the read back
// finds seq n+1 with our epoch and owner (W1's renewal) and a comparison of
// sequences decided "it landed" (the bytes differ: it did not). Commit returns nil; the authority's manifest does not name P. A seal
// then truncates the WAL through P: acknowledged records lost (see the engine's
// TestNoAcknowledgedRecordIsLostAfterAWriteOfUnknownOutcome).
func TestACommitIsNeverTakenForAnEarlierWriteOfTheSameSequence(t *testing.T) {
	ctx := context.Background()
	fd := fault.Wrap(mem.New(), 1)
	st := NewStore(bucket(t, "auth", fd))
	t.Cleanup(st.Close)
	o := acquire(t, st)
	if err := o.Commit(ctx, part(0, 4)); err != nil {
		t.Fatal(err)
	}
	fd.SetRules(sameSeqRules()...)
	if err := o.Confirm(ctx); !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("W1 renew: %v, want ErrUnknownOutcome", err)
	}
	err := o.Commit(ctx, part(4, 4))
	fd.SetRules()
	m, _, lerr := st.Load(ctx, "s")
	if lerr != nil {
		t.Fatal(lerr)
	}
	if err == nil && m.Sealed != 8 {
		t.Fatalf("Commit(part 4+4) returned nil (\"the part is in the authority's manifest\"), but the authority holds seq %d sealed %d with %d parts; the owner's view says sealed %d",
			m.Seq, m.Sealed, len(m.Parts), o.Sealed())
	}
}

// TestAReleaseIsNeverTakenForAnEarlierWriteOfTheSameSequence: the same
// confusion on Release. Renew (W1) lands with reply and read back lost; Release
// (W2, same seq) fails plainly; its read back finds W1 and Release returns nil. The
// authority still shows the lease held, unreleased: a cooperative Close reports a
// handover that did not happen, and the next machine gets ErrOwned for a whole
// lease.
func TestAReleaseIsNeverTakenForAnEarlierWriteOfTheSameSequence(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fd := fault.Wrap(drv, 1)
	st := NewStore(bucket(t, "auth", fd))
	t.Cleanup(st.Close)
	o := acquire(t, st)
	fd.SetRules(sameSeqRules()...)
	if err := o.Confirm(ctx); !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("W1 renew: %v, want ErrUnknownOutcome", err)
	}
	rerr := o.Release(ctx)
	fd.SetRules()
	stB := NewStore(bucket(t, "auth", drv))
	t.Cleanup(stB.Close)
	if rerr == nil {
		if _, _, err := Acquire(ctx, stB, "s", instance(t, stB, "B", LeaseOptions{}), LeaseOptions{}, nil); err != nil {
			t.Fatalf("Release returned nil, yet the next instance cannot take over: %v", err)
		}
		t.Fatal("a Release that failed without landing returned nil")
	}
	// It said it failed; a retry releases, and the next instance takes over.
	if err := o.Release(ctx); err != nil {
		t.Fatalf("the retried Release: %v", err)
	}
	if _, _, err := Acquire(ctx, stB, "s", instance(t, stB, "B", LeaseOptions{}), LeaseOptions{}, nil); err != nil {
		t.Fatalf("after the retried Release the next instance cannot take over: %v", err)
	}
}

// TestAManifestWriteNeverStretchesTheLease: the confusion of sameSeqRules on two
// writes with time between them. W1 (at t0) lands, reply and read back lost. W2
// (at t0+10s) fails plainly; its read back finds W1's bytes. When a manifest write
// renewed the shard's lease, the owner took that for a lease written at t0+10s,
// valid past the expiry the authority held, so that B took over while A still
// acknowledged. Now no manifest write extends anything: A's validity is its
// instance lease's, which runs out unrenewed before B may take over.
func TestAManifestWriteNeverStretchesTheLease(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	drv := mem.New()
	fd := fault.Wrap(drv, 1)
	st := NewStore(bucket(t, "auth", fd))
	t.Cleanup(st.Close)
	opts := LeaseOptions{Clock: clk}
	o, _, err := Acquire(ctx, st, "s", instance(t, st, "A", opts), opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	fd.SetRules(sameSeqRules()...)
	clk.Advance(time.Second)
	if err := o.Confirm(ctx); !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("W1: %v, want ErrUnknownOutcome", err)
	}
	clk.Advance(10 * time.Second)
	o.Confirm(ctx) // W2: the authority holds its bytes, which W1 wrote
	fd.SetRules()
	// Every later write of A's fails (the authority is unreachable for A).
	fd.SetRules(fault.Rule{Key: "manifest$", Err: errors.New("A partitioned")})
	clk.Advance(22 * time.Second) // t0+33s: past the authority's expiry plus the skew margin
	stB := NewStore(bucket(t, "auth", drv))
	t.Cleanup(stB.Close)
	b, _, err := Acquire(ctx, stB, "s", instance(t, stB, "B", opts), opts, nil)
	if err != nil {
		t.Fatalf("B's takeover after the authority's expiry: %v", err)
	}
	if err := o.Valid(); err == nil {
		t.Fatalf("B took over at epoch %d (the authority's lease expired), and A's Valid() still allows acknowledging: two owners acknowledge at once", b.Epoch())
	}
}
