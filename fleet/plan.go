package fleet

import (
	"cmp"
	"math"
	"slices"
)

// Member is an engine of the fleet: its instance id, and its weight, the share of
// the fleet's load it should carry relative to the others (its cores, say). A
// weight of 0 counts as 1.
type Member struct {
	ID     string
	Weight float64
}

// Shard is a shard to place and its weight, its expected load; 0 counts as 1.
type Shard struct {
	ID     string
	Weight float64
}

// Assignment maps each shard's id to the id of the member it is assigned to.
type Assignment map[string]string

// Plan returns where each shard should be, given the members alive now, every
// shard, the shards' current owners and the previous assignment. The same input
// gives the same assignment.
//
// It is sticky. A shard stays with its assignee while that member is one, whether
// it claimed the shard yet or not: re-placing queued shards at every publish makes
// a fleet revoke faster than it completes, and planning a shard back to the
// member it is being handed over from (which still claims it) undoes the move half
// done. A shard whose assignee is gone stays with its owner, if that is a member.
// Shards with neither (new ones, or those of a member gone) go to the members
// furthest below their share.
//
// Then it balances, moving no more than balance requires. A member's share is the
// total shard weight times its part of the member weight. While the member
// furthest above its share and the one furthest below are together more than two
// shards' weight from their shares, one shard moves between them; each move
// narrows the gap. The second shard of slack is hysteresis: one shard ending, or
// one arriving, leaves the rest where they are, instead of moving another to even
// the count. Unclaimed shards move first, since they need no handoff. A joining
// member so gets its share, to within a shard or two, within one publish.
func Plan(members []Member, shards []Shard, owners map[string]string, prev Assignment) Assignment {
	out := Assignment{}
	if len(members) == 0 {
		return out
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	ss := slices.Clone(shards)
	slices.SortFunc(ss, func(a, b Shard) int { return cmp.Compare(a.ID, b.ID) })

	p := newPlanner(ms, ss)
	var unplaced []Shard
	for _, s := range ss {
		switch {
		case p.has(prev[s.ID]):
			// Its assignee, which owns it or will: a shard whose handoff is in
			// flight is still claimed by the member it leaves, and planning it
			// back there would undo the move half done.
			p.place(s, prev[s.ID])
		case p.has(owners[s.ID]):
			p.place(s, owners[s.ID])
		default:
			unplaced = append(unplaced, s)
		}
	}
	// The heaviest first, each to the member furthest below its share.
	slices.SortStableFunc(unplaced, func(a, b Shard) int { return cmp.Compare(weight(b.Weight), weight(a.Weight)) })
	for _, s := range unplaced {
		p.place(s, p.furthestBelow())
	}
	p.balance(owners)
	for id, m := range p.where {
		out[id] = m
	}
	return out
}

// planner is the assignment being built.
type planner struct {
	members []Member
	target  map[string]float64 // each member's share of the total shard weight
	load    map[string]float64
	held    map[string][]Shard // by member, in id order
	where   map[string]string  // shard → member
	maxW    float64            // the heaviest shard's weight
}

func newPlanner(ms []Member, ss []Shard) *planner {
	p := &planner{members: ms, target: map[string]float64{}, load: map[string]float64{}, held: map[string][]Shard{}, where: map[string]string{}}
	var total, weights float64
	for _, s := range ss {
		total += weight(s.Weight)
		p.maxW = max(p.maxW, weight(s.Weight))
	}
	for _, m := range ms {
		weights += weight(m.Weight)
	}
	for _, m := range ms {
		p.target[m.ID] = total * weight(m.Weight) / weights
	}
	return p
}

func (p *planner) has(member string) bool {
	_, ok := p.target[member]
	return ok && member != ""
}

func (p *planner) place(s Shard, member string) {
	p.where[s.ID] = member
	p.load[member] += weight(s.Weight)
	p.held[member] = append(p.held[member], s)
}

func (p *planner) remove(s Shard, member string) {
	p.load[member] -= weight(s.Weight)
	p.held[member] = slices.DeleteFunc(p.held[member], func(h Shard) bool { return h.ID == s.ID })
}

// excess is how far member is above its share (negative: below).
func (p *planner) excess(member string) float64 { return p.load[member] - p.target[member] }

func (p *planner) furthestBelow() string { return p.extreme(-1) }

func (p *planner) furthestAbove() string { return p.extreme(1) }

// extreme returns the member whose excess, times sign, is the largest; the first
// in id order on a tie.
func (p *planner) extreme(sign float64) string {
	best := p.members[0].ID
	for _, m := range p.members[1:] {
		if sign*p.excess(m.ID) > sign*p.excess(best) {
			best = m.ID
		}
	}
	return best
}

// balance moves shards from the member furthest above its share to the one
// furthest below, one at a time, while their combined distance from their shares
// (the gap) is over two shards. A move of weight w from a to b narrows it when w is
// under the gap, and lowers the sum of the squared distances, so balance ends.
func (p *planner) balance(owners map[string]string) {
	const slack = 1e-9
	for {
		a, b := p.furthestAbove(), p.furthestBelow()
		gap := p.excess(a) - p.excess(b)
		if a == b || gap <= 2*p.maxW+slack {
			return
		}
		s, ok := p.pick(a, gap, owners)
		if !ok {
			return
		}
		p.remove(s, a)
		p.place(s, b)
	}
}

// pick chooses the shard of member a to move across a gap: one whose weight is
// under it, unclaimed before claimed (no handoff), then the heaviest that fits,
// then by id.
func (p *planner) pick(a string, gap float64, owners map[string]string) (Shard, bool) {
	var best Shard
	found := false
	better := func(s Shard) bool {
		if !found {
			return true
		}
		sc, bc := owners[s.ID] == a, owners[best.ID] == a
		if sc != bc {
			return !sc
		}
		return weight(s.Weight) > weight(best.Weight)
	}
	for _, s := range p.held[a] {
		if weight(s.Weight) < gap && better(s) {
			best, found = s, true
		}
	}
	return best, found
}

func weight(w float64) float64 {
	if w <= 0 || math.IsNaN(w) || math.IsInf(w, 0) {
		return 1
	}
	return w
}
