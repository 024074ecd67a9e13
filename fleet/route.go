package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/manifest"
)

// attrAddress is the lease attribute a member advertises its address in.
const attrAddress = "l0.address"

// Endpoint is a member as a Route names it.
type Endpoint struct {
	// Member is the member's instance.
	Member string
	// Address is what the member advertised (Options.Address); empty if it
	// advertised none.
	Address string
}

// Route is where a shard is served.
type Route struct {
	// Owner is the member whose engine holds the shard's lease: the one that
	// serves its appends and reads now. It is zero while no live member holds it
	// (a handoff between its release and the next open, or a member that died
	// and whose lease has not run out: Err then says who).
	Owner Endpoint
	// Assignee is the member the published assignment gives the shard to. It
	// differs from Owner while a handoff runs, and serves the shard once it
	// opened it. It is zero if the assignment names no member, or one whose
	// lease has lapsed.
	Assignee Endpoint
}

// Route answers who serves shard id, for a server that redirects a request it
// cannot serve. It never names a member whose instance lease has lapsed or was
// released (by this engine's clock and the skew margin) as far as it read; what
// it read is at most PollEvery old, so a member that left within the last
// PollEvery may still be named, and refuses the request itself. A shard open
// here is answered without a read.
func (m *Membership) Route(ctx context.Context, id string) (Route, error) {
	m.mu.Lock()
	assignee := m.mu.assigned[id]
	m.mu.Unlock()
	var r Route
	if sh, ok := m.Shard(id); ok && !sh.Fenced() && m.e.Err() == nil {
		r.Owner = Endpoint{Member: m.id, Address: m.opts.Address}
	} else {
		owner, err := m.routes.owner(ctx, m, id)
		if err != nil {
			return Route{}, err
		}
		r.Owner = owner
	}
	if assignee != "" {
		ep, live, _, err := m.routes.member(ctx, m, assignee)
		if err != nil {
			return Route{}, err
		}
		if live {
			r.Assignee = ep
		}
	}
	return r, nil
}

// routes caches what Route reads: instance leases and shards' owners, each for
// PollEvery, so that a server routing many requests reads each at most once per
// PollEvery.
type routes struct {
	mu     sync.Mutex
	leases map[string]cached[lease.Record] // instance → its lease
	owners map[string]cached[manifest.Manifest]
	lastGC time.Time
}

type cached[T any] struct {
	v  T
	at time.Time
}

// fresh returns what the cache holds for key if it was read within d of now.
func fresh[T any](c map[string]cached[T], key string, now time.Time, d time.Duration) (T, bool) {
	e, ok := c[key]
	if !ok || now.Sub(e.at) >= d {
		var zero T
		return zero, false
	}
	return e.v, true
}

// member returns instance's endpoint, whether its lease lives, and the lease as
// read (zero for this member's own).
func (rs *routes) member(ctx context.Context, m *Membership, instance string) (Endpoint, bool, lease.Record, error) {
	if instance == m.id {
		return Endpoint{Member: m.id, Address: m.opts.Address}, m.e.Err() == nil, lease.Record{}, nil
	}
	now := m.clock.Now()
	rs.mu.Lock()
	rec, ok := fresh(rs.leases, instance, now, m.opts.PollEvery)
	rs.mu.Unlock()
	if !ok {
		var err error
		if rec, _, err = lease.Read(ctx, m.bucket, lease.InstanceKey(instance)); err != nil {
			return Endpoint{}, false, lease.Record{}, fmt.Errorf("fleet %s: route: the lease of %s: %w", m.opts.Name, instance, err)
		}
		rs.put(func() { rs.leases[instance] = cached[lease.Record]{rec, now} }, now)
	}
	return Endpoint{Member: instance, Address: rec.Attrs[attrAddress]}, serving(rec, now, m.leaseOpts.SkewMargin), rec, nil
}

// serving reports whether a lease's holder still serves what it holds at now by
// a clock within skew of the holder's: the holder stops acknowledging skew before
// its expiry by its own clock, so a router stops naming it skew before that.
func serving(rec lease.Record, now time.Time, skew time.Duration) bool {
	return rec.Holder != "" && !rec.Released && now.Before(rec.Expiry.Add(-2*skew))
}

// owner returns the member that holds shard id's lease, if it lives.
func (rs *routes) owner(ctx context.Context, m *Membership, id string) (Endpoint, error) {
	now := m.clock.Now()
	rs.mu.Lock()
	man, ok := fresh(rs.owners, id, now, m.opts.PollEvery)
	rs.mu.Unlock()
	if !ok {
		var err error
		if man, err = manifest.LoadFrom(ctx, m.bucket, id); err != nil {
			return Endpoint{}, fmt.Errorf("fleet %s: route %s: %w", m.opts.Name, id, err)
		}
		rs.put(func() {
			rs.owners[id] = cached[manifest.Manifest]{manifest.Manifest{Owner: man.Owner, Lease: man.Lease, Released: man.Released}, now}
		}, now)
	}
	// An owner that is this member, but without the shard open (Route asked
	// first), serves it no more.
	if man.Owner == "" || man.Released || man.Owner == m.id {
		return Endpoint{}, nil
	}
	ep, live, rec, err := rs.member(ctx, m, man.Owner)
	// The lease must be the acquisition the manifest names, or one that vouches
	// for it: an instance restarted since that has not opened the shard again
	// does not serve it.
	if err != nil || !live || !rec.Holds(man.Lease) {
		return Endpoint{}, err
	}
	return ep, nil
}

// put stores an entry under the lock, dropping the stale ones at most once per
// minute so the cache holds what was routed lately, not every shard ever.
func (rs *routes) put(store func(), now time.Time) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.leases == nil {
		rs.leases, rs.owners = map[string]cached[lease.Record]{}, map[string]cached[manifest.Manifest]{}
	}
	if now.Sub(rs.lastGC) > time.Minute {
		for k, e := range rs.leases {
			if now.Sub(e.at) > time.Minute {
				delete(rs.leases, k)
			}
		}
		for k, e := range rs.owners {
			if now.Sub(e.at) > time.Minute {
				delete(rs.owners, k)
			}
		}
		rs.lastGC = now
	}
	store()
}
