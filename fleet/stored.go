package fleet

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate"
)

// Stored is a fleet as its objects on the authority hold it, read by someone who
// is not a member (an operator's tool): the assignment last published, the leader
// lease, and every instance lease that names the fleet, live or not, as written.
// Judging which leases live is the reader's, by its clock (StoredLease.Live).
type Stored struct {
	Name string `json:"name"`
	// Seq counts the assignment's publishes (0: none yet); Publisher is the
	// leader that published the last, and Planned the members it planned for.
	Seq        uint64     `json:"seq"`
	Publisher  string     `json:"publisher,omitempty"`
	Planned    []string   `json:"planned,omitempty"`
	Assignment Assignment `json:"assignment"`
	// Leader is the leader lease as stored; zero when there is none.
	Leader StoredLease `json:"leader"`
	// Members are the instance leases that name the fleet, by instance id.
	Members []StoredMember `json:"members"`
}

// StoredMember is one instance lease that names the fleet.
type StoredMember struct {
	ID      string      `json:"id"`
	Weight  float64     `json:"weight"`
	Shards  []string    `json:"shards,omitempty"` // the shards it says it owns
	Leaving bool        `json:"leaving,omitempty"`
	Lease   StoredLease `json:"lease"`
}

// StoredLease is a lease as its object holds it.
type StoredLease struct {
	// Holder holds it, until Expiry by the holder's clock unless renewed, or
	// until Released.
	Holder   string            `json:"holder"`
	Expiry   time.Time         `json:"expiry,omitzero"`
	Released bool              `json:"released,omitempty"`
	Attrs    map[string]string `json:"attrs,omitempty"`
}

// Live reports whether the lease lives at at, by a clock within skew of the
// holder's: held, not released, and not past its expiry by more than skew.
func (l StoredLease) Live(at time.Time, skew time.Duration) bool { return l.record().Live(at, skew) }

func (l StoredLease) record() lease.Record {
	return lease.Record{Holder: l.Holder, Expiry: l.Expiry, Released: l.Released, Attrs: l.Attrs}
}

func storedLease(r lease.Record) StoredLease {
	return StoredLease{Holder: r.Holder, Expiry: r.Expiry, Released: r.Released, Attrs: r.Attrs}
}

// ReadStored reads the fleet name's objects from b, the engines' authority. An
// assignment that does not decode is ErrCorrupt, with the rest read all the same.
func ReadStored(ctx context.Context, b *substrate.Bucket, name string) (Stored, error) {
	s := Stored{Name: name}
	p, _, aerr := readAssignment(ctx, b, name)
	if aerr != nil && !errors.Is(aerr, ErrCorrupt) {
		return Stored{}, aerr
	}
	s.Seq, s.Publisher, s.Planned, s.Assignment = p.Seq, p.Leader, p.Members, p.Shards
	leader, _, err := lease.Read(ctx, b, leaderKey(name))
	if err != nil {
		return Stored{}, err
	}
	s.Leader = storedLease(leader)
	recs, _, err := lease.ListAll(ctx, b, lease.InstancesPrefix, "/lease")
	if err != nil {
		return Stored{}, err
	}
	for _, r := range recs {
		if r.Attrs[attrFleet] != name {
			continue
		}
		w, _ := strconv.ParseFloat(r.Attrs[attrWeight], 64)
		m := StoredMember{ID: r.Holder, Weight: w, Leaving: r.Attrs[attrLeaving] == "1", Lease: storedLease(r)}
		if sh := r.Attrs[attrShards]; sh != "" {
			m.Shards = strings.Split(sh, ",")
		}
		s.Members = append(s.Members, m)
	}
	slices.SortFunc(s.Members, func(a, b StoredMember) int { return strings.Compare(a.ID, b.ID) })
	return s, aerr
}

// StoredNames returns the names of the fleets with objects on b (an assignment, a
// leader lease, scan leases) or named by an instance lease, sorted.
func StoredNames(ctx context.Context, b *substrate.Bucket) ([]string, error) {
	seen := map[string]bool{}
	for e, err := range b.ListAll(ctx, "fleet/") {
		if err != nil {
			return nil, err
		}
		if name, _, ok := strings.Cut(strings.TrimPrefix(e.Key, "fleet/"), "/"); ok {
			seen[name] = true
		}
	}
	recs, _, err := lease.ListAll(ctx, b, lease.InstancesPrefix, "/lease")
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if name := r.Attrs[attrFleet]; name != "" {
			seen[name] = true
		}
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	slices.Sort(names)
	return names, nil
}
