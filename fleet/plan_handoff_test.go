package fleet

import (
	"maps"
	"testing"
)

// A publish made while the previous one's handoffs are in flight undoes some of
// them. Plan keeps a shard with its owner before its assignee, and a shard being
// drained is still owned — by the member it is leaving (its lease claims it until
// the drain ends and its next step republishes the claim). So the shard goes back
// to that member; the hysteresis then keeps it there, and the joining member, short
// of its share, waits for a publish that never comes, while the old owner hands the
// shard over and opens it again.
//
// m0 and m1 hold the 11 shards; m2 joins. The first plan moves s00 and s01 from m0,
// and s02 from m1, to m2. When the leader plans again, s02 is open on m2, s00 is
// between owners, and s01 is still draining on m0.
func TestPlanDuringAHandoffKeepsThePublishedMoves(t *testing.T) {
	members := []Member{{ID: "m0", Weight: 1}, {ID: "m1", Weight: 1}, {ID: "m2", Weight: 1}}
	shards := []Shard{
		{"s00", 2}, {"s01", 2}, {"s02", 3}, {"s03", 3}, {"s04", 1}, {"s05", 2},
		{"s06", 2}, {"s07", 3}, {"s08", 2}, {"s09", 2}, {"s10", 2},
	}
	before := map[string]string{
		"s00": "m0", "s01": "m0", "s02": "m1", "s03": "m1", "s04": "m0", "s05": "m1",
		"s06": "m0", "s07": "m1", "s08": "m0", "s09": "m0", "s10": "m0",
	}
	first := Plan(members, shards, before, Assignment(before))
	want := maps.Clone(before)
	want["s00"], want["s01"], want["s02"] = "m2", "m2", "m2"
	if !maps.Equal(first, Assignment(want)) {
		t.Fatalf("the first plan is %v, want %v (what this test is about changed)", first, want)
	}
	during := maps.Clone(before)
	delete(during, "s00") // drained, not yet opened on m2
	// s01: still draining on m0, or drained with m0's claim not yet republished
	during["s02"] = "m2" // opened on m2
	second := Plan(members, shards, during, first)
	for id, m := range first {
		if second[id] != m {
			t.Errorf("shard %s: the first publish moved it to %s; the next, with its handoff in flight (owned by %q), moves it to %s", id, m, during[id], second[id])
		}
	}
}
