package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// TestRouteFromAMemberWhoseLeaseLapsedNeverNamesItself: Route never names a
// member whose instance lease has lapsed, and names as Owner only a member that
// holds the shard's lease. That holds for the member asking about itself too: a
// server that asks its own Membership where to send a request must not be told
// "here" once its lease ran out, least of all after another member took the
// shard.
//
// The interleaving: a and b share four shards; b is cut off from the store. Its
// renewals fail, and its lease lapses by its own clock two seconds later; a takes
// b's shards over once the lease ran out by a's clock. b's handles are never
// told (nothing b can read says so), so they lapse without being fenced.
// Expected: from the lapse on, b's Route names b for none of its shards, as Owner
// or as Assignee. Found: Route answers an open shard with "this member" whenever
// its handle is not Fenced, and a lapsed lease is not fenced; the Assignee check
// for this member asks Engine.Err, which is nil while renewals fail. b names
// itself Owner and Assignee of its shards long after its lease lapsed, and after
// a holds their leases.
func TestRouteFromAMemberWhoseLeaseLapsedNeverNamesItself(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	short := engine.Options{Lease: engine.LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}, RenewEvery: 300 * time.Millisecond}
	a := joinMemWith(t, drv, shards, Options{Address: "a.example:8080"}, short)
	b := joinMemWith(t, drv, shards, Options{Address: "b.example:8080"}, short)
	if !eventually(20*time.Second, func() bool { return openOn(shards, a, b) && len(a.m.Owned()) > 0 && len(b.m.Owned()) > 0 }) {
		t.Fatalf("a owns %v, b %v", a.m.Owned(), b.m.Owned())
	}
	onB := b.m.Owned()
	ctx := context.Background()
	// b's assignment must be known to b before the cut, so that it is the one b
	// keeps following.
	if !eventually(10*time.Second, func() bool {
		for _, id := range onB {
			if r, err := b.m.Route(ctx, id); err != nil || r.Assignee.Member != b.m.ID() {
				return false
			}
		}
		return true
	}) {
		t.Fatal("b's routes of its own shards never named it assignee")
	}

	b.fd.SetRules(fault.Rule{Err: errors.New("b cut off")})
	cut := time.Now()
	time.Sleep(2 * time.Second) // b's last renewal began before the cut: lapsed by now
	check := func(when string) {
		t.Helper()
		for _, id := range onB {
			r, err := b.m.Route(ctx, id)
			if err != nil {
				continue // b cannot read: it may say it does not know
			}
			if r.Owner.Member == b.m.ID() || r.Assignee.Member == b.m.ID() {
				t.Errorf("%s (%s after the cut), b routes %s to itself: %+v", when, time.Since(cut).Round(time.Millisecond), id, r)
			}
		}
	}
	check("with b's lease lapsed")
	if !eventually(30*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a does not serve b's shards %v 30 s after b was cut off", onB)
	}
	check("with a serving every shard")
}
