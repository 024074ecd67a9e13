package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate"
)

// The attributes a member publishes with its instance lease.
const (
	attrFleet   = "l0.fleet"   // the fleet's name: the lease's holder is a member
	attrWeight  = "l0.weight"  // the member's weight
	attrShards  = "l0.shards"  // the shards it owns, sorted, comma-separated
	attrLeaving = "l0.leaving" // "1": it is leaving, and takes no shard
)

func leaderKey(fleet string) string     { return "fleet/" + fleet + "/leader" }
func assignmentKey(fleet string) string { return "fleet/" + fleet + "/assignment" }

// published is the assignment object: the desired owner of every shard, as the
// leader last published it.
type published struct {
	// Seq counts the publishes.
	Seq uint64 `json:"seq"`
	// Leader is the member that published it, and Members the members it
	// planned for (each takes its share of the scan shards by their number).
	Leader  string     `json:"leader"`
	Members []string   `json:"members"`
	Shards  Assignment `json:"shards"`
}

// readAssignment returns the published assignment and its version; the empty one
// before the first publish, and with ErrCorrupt the version of one that does not
// decode.
func readAssignment(ctx context.Context, b *substrate.Bucket, fleet string) (published, substrate.Version, error) {
	data, attrs, err := b.Get(ctx, assignmentKey(fleet))
	if errors.Is(err, substrate.ErrNotFound) {
		return published{Shards: Assignment{}}, "", nil
	}
	if err != nil {
		return published{}, "", fmt.Errorf("fleet %s: read the assignment: %w", fleet, err)
	}
	var p published
	if err := json.Unmarshal(data, &p); err != nil {
		// Its version too: the leader writes over it.
		return published{}, attrs.Version, fmt.Errorf("fleet %s: the assignment: %w: %w", fleet, ErrCorrupt, err)
	}
	if p.Shards == nil {
		p.Shards = Assignment{}
	}
	return p, attrs.Version, nil
}

// writeAssignment publishes p by compare-and-swap on ver; it reports false when
// another publish came first.
func writeAssignment(ctx context.Context, b *substrate.Bucket, fleet string, p published, ver substrate.Version) (bool, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return false, err
	}
	if ver == "" {
		_, created, err := b.PutIfAbsentBytes(ctx, assignmentKey(fleet), data)
		return created, err
	}
	_, err = b.CompareAndSwapBytes(ctx, assignmentKey(fleet), ver, data)
	if errors.Is(err, substrate.ErrPreconditionFailed) {
		return false, nil
	}
	return err == nil, err
}

// view is the fleet as one read of the instance leases saw it.
type view struct {
	members []Member
	owners  map[string]string // shard → the member that owns it
	corrupt []string          // lease objects that do not decode: no member's
}

// readMembers lists the live instance leases of the fleet's members: each is a
// member unless it is leaving, and owns the shards it says.
func readMembers(ctx context.Context, b *substrate.Bucket, fleet string, opts lease.Options) (view, error) {
	at := opts.Clock.Now()
	recs, corrupt, err := lease.ListAll(ctx, b, lease.InstancesPrefix, "/lease")
	if err != nil {
		return view{}, err
	}
	v := view{owners: map[string]string{}, corrupt: corrupt}
	for _, r := range recs {
		if r.Attrs[attrFleet] != fleet || !r.Live(at, opts.SkewMargin) {
			continue
		}
		if s := r.Attrs[attrShards]; s != "" {
			for id := range strings.SplitSeq(s, ",") {
				v.owners[id] = r.Holder
			}
		}
		if r.Attrs[attrLeaving] == "1" {
			continue
		}
		w, _ := strconv.ParseFloat(r.Attrs[attrWeight], 64)
		v.members = append(v.members, Member{ID: r.Holder, Weight: w})
	}
	return v, nil
}

// lead does the leader's part of a step: take or renew the leader lease, and,
// at most once per PublishEvery, publish the plan if it differs from what is
// published.
func (m *Membership) lead(ctx context.Context) error {
	if m.leader == nil {
		// Acquire reads the lease first and refuses one another member holds.
		h, err := lease.Acquire(ctx, m.bucket, leaderKey(m.opts.Name), m.id, nil, m.leaseOpts)
		if errors.Is(err, lease.ErrHeld) {
			return nil
		}
		if err != nil {
			return err
		}
		m.leader = h
	} else if lost, err := m.renewDue(ctx, m.leader); lost {
		m.leader = nil
		return nil
	} else if err != nil {
		return err
	}
	if _, err := m.leader.Valid(); err != nil {
		return nil // a renewal may bring it back
	}
	if now := m.clock.Now(); now.Before(m.lastPublish.Add(m.opts.PublishEvery)) {
		return nil
	}
	v, err := readMembers(ctx, m.bucket, m.opts.Name, m.leaseOpts)
	if err != nil {
		return err
	}
	if len(v.corrupt) > 0 && !m.warnedCorrupt {
		m.warnedCorrupt = true
		m.opts.Logger.Warn("fleet: instance leases that do not decode are no member's", "fleet", m.opts.Name, "keys", v.corrupt)
	}
	shards, err := m.opts.Shards(ctx)
	if err != nil {
		return fmt.Errorf("fleet %s: the shards: %w", m.opts.Name, err)
	}
	cur, ver, err := readAssignment(ctx, m.bucket, m.opts.Name)
	if errors.Is(err, ErrCorrupt) {
		// Planned afresh from the owners, which keep their shards, and written
		// over it.
		m.opts.Logger.Warn("fleet: the assignment does not decode; publishing a new one over it", "fleet", m.opts.Name, "err", err)
		cur = published{Shards: Assignment{}}
	} else if err != nil {
		return err
	}
	plan := Plan(v.members, shards, v.owners, cur.Shards)
	ids := make([]string, len(v.members))
	for i, mb := range v.members {
		ids[i] = mb.ID
	}
	slices.Sort(ids)
	if maps.Equal(plan, cur.Shards) && slices.Equal(ids, cur.Members) {
		return nil
	}
	m.lastPublish = m.clock.Now()
	ok, err := writeAssignment(ctx, m.bucket, m.opts.Name, published{Seq: cur.Seq + 1, Leader: m.id, Members: ids, Shards: plan}, ver)
	if err != nil {
		return fmt.Errorf("fleet %s: publish the assignment: %w", m.opts.Name, err)
	}
	if ok {
		m.stats.publishes.Add(1)
	}
	return nil
}

// renewDue renews h if a third of a lease passed since its last renewal, the
// pace of the fleet's own leases (leader, scan shards); lost reports one another
// process wrote over, which is gone for good.
func (m *Membership) renewDue(ctx context.Context, h *lease.Held) (lost bool, err error) {
	if m.clock.Now().Before(h.Renewed().Add(m.leaseOpts.Duration / 3)) {
		return false, nil
	}
	err = h.Renew(ctx)
	if errors.Is(err, lease.ErrLost) {
		return true, nil
	}
	return false, err
}
