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

// TestRouteNamesTheServingMemberAndNeverALapsedOne: two members on machines of
// their own, each advertising an address, place four shards. From either, Route
// names for every shard the member that has it open, with its address, as
// owner and assignee. Then b is cut off from the store: its lease lapses, and
// from then on a's Route names b for no shard, as owner or assignee, until a
// serves them all.
func TestRouteNamesTheServingMemberAndNeverALapsedOne(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	short := engine.Options{Lease: engine.LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}, RenewEvery: 300 * time.Millisecond}
	a := joinMemWith(t, drv, shards, Options{Address: "a.example:8080"}, short)
	b := joinMemWith(t, drv, shards, Options{Address: "b.example:8080"}, short)
	addr := map[string]string{a.m.ID(): "a.example:8080", b.m.ID(): "b.example:8080"}
	if !eventually(20*time.Second, func() bool { return openOn(shards, a, b) && len(a.m.Owned()) > 0 && len(b.m.Owned()) > 0 }) {
		t.Fatalf("a owns %v, b %v", a.m.Owned(), b.m.Owned())
	}
	ctx := context.Background()
	settled := func(from *memMember, members ...*memMember) bool {
		for _, s := range shards {
			r, err := from.m.Route(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			var serving *memMember
			for _, mm := range members {
				if sh, ok := mm.m.Shard(s.ID); ok && !sh.Fenced() {
					serving = mm
				}
			}
			if serving == nil {
				return false
			}
			want := Endpoint{Member: serving.m.ID(), Address: addr[serving.m.ID()]}
			if r.Owner != want || r.Assignee != want {
				t.Logf("from %s, %s routes to %+v, served by %+v", from.m.ID(), s.ID, r, want)
				return false
			}
		}
		return true
	}
	for _, from := range []*memMember{a, b} {
		if !eventually(10*time.Second, func() bool { return settled(from, a, b) }) {
			t.Fatalf("routes from %s never settled on the serving members", from.m.ID())
		}
	}

	onB := b.m.Owned()
	b.fd.SetRules(fault.Rule{Err: errors.New("b cut off")})
	cut := time.Now()
	lapsedBy := cut.Add(2 * time.Second) // b's last renewal began before the cut
	for !openOn(shards, a) {
		for _, s := range shards {
			r, err := a.m.Route(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if time.Now().After(lapsedBy) && (r.Owner.Member == b.m.ID() || r.Assignee.Member == b.m.ID()) {
				t.Fatalf("%s after b was cut off, a routes %s to b: %+v", time.Since(cut), s.ID, r)
			}
		}
		if time.Since(cut) > 30*time.Second {
			t.Fatalf("a does not serve b's shards %v 30 s after b was cut off", onB)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !eventually(10*time.Second, func() bool { return settled(a, a) }) {
		t.Fatal("a's routes never settled on a after b was cut off")
	}
}
