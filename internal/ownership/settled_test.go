package ownership

import (
	"context"
	"errors"
	"testing"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// TestAnOwnerWhoseWriteMayHaveLandedUnseenIsNotSettled: a renewal lands but its
// reply is lost, and the authority cannot be read back. The owner's view may then
// be behind the authority's, and it says so until a later write reads the
// authority: a reader that trusts the view (tail collection) must load the
// manifest instead.
func TestAnOwnerWhoseWriteMayHaveLandedUnseenIsNotSettled(t *testing.T) {
	ctx := context.Background()
	drv := fault.Wrap(mem.New(), 1)
	st := NewStore(bucket(t, "a", drv))
	o, _, err := Acquire(ctx, st, "s", instance(t, st, "A", LeaseOptions{Clock: testclock.New()}), LeaseOptions{Clock: testclock.New()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Settled() {
		t.Fatal("a new owner is not settled")
	}
	lost := errors.New("lost reply")
	drv.SetRules(
		fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Err: lost, Ambiguous: true},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Err: lost},
	)
	if err := o.Confirm(ctx); !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("renewal with its reply and the read-back lost: %v, want ErrUnknownOutcome", err)
	}
	if o.Settled() {
		t.Fatal("the owner says its view is the authority's after a write that may have landed unseen")
	}
	drv.SetRules()
	if err := o.Confirm(ctx); err != nil {
		t.Fatal(err)
	}
	if !o.Settled() {
		t.Fatal("the owner is not settled after a renewal that read the authority")
	}
}
