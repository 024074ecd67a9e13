package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// TestALeaveLongerThanALeaseGivesUpTheLeaderLeaseAndItsAttributes: Leave hands
// every shard over (each drain within DrainDeadline, cooperative here), then gives
// the leader and scan leases up and takes the fleet's attributes off the engine's
// lease; "the steps after ctx ended run on their own bounded contexts". A Leave
// whose context has time left must do all of it.
//
// The interleaving: a leads and owns four shards; b joins; a's part writes take
// longer than a lease (a slow store, well within the drain deadline of 10 s). a
// leaves with a context of 30 s: its shards go to b, each drain sealing
// cooperatively. Expected: once Leave returns, the leader lease is released and
// a's lease carries none of the fleet's attributes. Found: Leave takes its own
// context for those last steps, of one lease's duration, before it waits for the
// handoffs; the handoffs outlast it (with the defaults, any handoff past 6 s
// does, though DrainDeadline is 10 s), and the leader lease's release and the
// attributes' removal fail with the deadline exceeded: no member leads until the
// leader lease runs out, and a's live lease still says it is a leaving member,
// with its address.
func TestALeaveLongerThanALeaseGivesUpTheLeaderLeaseAndItsAttributes(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	short := engine.Options{Lease: engine.LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}, RenewEvery: 300 * time.Millisecond}
	a := joinMemWith(t, drv, shards, Options{Address: "a.example:8080"}, short)
	if !eventually(10*time.Second, func() bool { return len(a.m.Owned()) == 4 && a.m.Stats().Leader }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	b := joinMemWith(t, drv, shards, Options{}, short)
	appendEach(t, shards, a, b)
	a.fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent}, Key: "/parts/", Latency: 3 * time.Second})

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := a.m.Leave(ctx)
	took := time.Since(start)
	a.fd.SetRules()
	sa := a.m.Stats()
	t.Logf("a's Leave took %s: %v; %d handoffs, %d cooperative, %d forced", took.Round(time.Millisecond), err, sa.Revocations, sa.Cooperative, sa.Forced)
	if err != nil {
		t.Errorf("a's Leave, every shard handed over within its context: %v", err)
	}
	r, _, rerr := lease.Read(t.Context(), a.e.Authority(), leaderKey("default"))
	if rerr != nil {
		t.Fatal(rerr)
	}
	if r.Holder == a.m.ID() && !r.Released {
		t.Errorf("after a's Leave returned, the leader lease is still a's (until %s), not released", r.Expiry.Format(time.RFC3339Nano))
	}
	if attrs := a.e.Attributes(); attrs[attrFleet] != "" || attrs[attrAddress] != "" || attrs[attrLeaving] != "" {
		t.Errorf("after a's Leave returned, a's lease still carries the fleet's attributes: %v", attrs)
	}
}
