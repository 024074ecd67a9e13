package ownership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// before reports whether (incarnation, seq) comes before (oi, os) in a tail.
func before(incarnation, seq, oi, os uint64) bool {
	return incarnation < oi || (incarnation == oi && seq < os)
}

// errAlreadyDone reports a change the manifest already holds: nothing to write.
var errAlreadyDone = errors.New("manifest: already done")

// LeaseOptions configure ownership. The zero value of each field means its default.
type LeaseOptions struct {
	// Duration is how long a lease lasts after it was taken or last renewed: the
	// instance lease's, which the owner's shards share. Default 6 s.
	Duration time.Duration
	// SkewMargin is how much two instances' clocks may disagree. The owner stops
	// acknowledging SkewMargin before its lease's expiry by its own clock, and
	// another instance takes an unreleased lease over only SkewMargin after it by
	// its own. Default 1 s; must be under half of Duration.
	SkewMargin time.Duration
	// Wait makes Acquire wait for a lease held by another instance to expire instead
	// of failing with ErrOwned.
	Wait bool
	// Clock is the clock of expiries and of Wait. Default clock.Real.
	Clock clock.Clock
}

// EnsureDefaults fills in the zero fields, those of the instance lease as
// package lease defaults them.
func (o *LeaseOptions) EnsureDefaults() {
	l := o.LeaseOf()
	l.EnsureDefaults()
	o.Duration, o.SkewMargin, o.Clock = l.Duration, l.SkewMargin, l.Clock
}

// Validate reports invalid defaulted options.
func (o *LeaseOptions) Validate() error {
	l := o.LeaseOf()
	return l.Validate()
}

// LeaseOf returns the lease options ownership under opts needs of an instance
// lease.
func (o LeaseOptions) LeaseOf() lease.Options {
	return lease.Options{Duration: o.Duration, SkewMargin: o.SkewMargin, Clock: o.Clock}
}

// Owner is this instance's ownership of one shard, and the only writer of its
// manifest while it holds: the manifest names the owner's instance lease, and the
// ownership is valid while that lease is, under the generation it was last
// confirmed in. It is safe for concurrent use; its writes are serialized, and
// Valid, Manifest and Sealed never wait for one: they read what the last write
// published.
type Owner struct {
	store    *Store
	instance string
	lease    *lease.Held
	epoch    uint64
	opts     LeaseOptions

	published atomic.Pointer[manifest.Manifest] // as last published; never modified
	// gen is the instance lease's generation the ownership was last confirmed
	// in, by a write of the manifest that began in it; 0 for none.
	gen      atomic.Uint64
	validity atomic.Pointer[validity]
	// doubt is set while a write of the owner may have landed unseen: its reply
	// was lost and the authority could not be read back. The authority may then
	// hold a newer manifest than published.
	doubt atomic.Bool

	mu struct {
		sync.Mutex // held across a publish
		ver        substrate.Version
	}
	adds struct {
		sync.Mutex
		queue []*replicaAdd
	}
}

// validity is why the owner stopped acknowledging for good, if it did.
type validity struct {
	err error // sticky: fenced or released
}

// Acquire takes shard over under the instance lease held: Inspect, then before (if
// not nil) with the manifest as it was and the epoch about to be taken, then Take
// with no tail pointer, again from Inspect while another write comes between. An
// error from before abandons the takeover. It returns the Owner and the manifest
// as it was before the takeover.
func Acquire(ctx context.Context, store *Store, shard string, held *lease.Held, opts LeaseOptions, before func(prev manifest.Manifest, epoch uint64) error) (*Owner, manifest.Manifest, error) {
	for {
		c, err := Inspect(ctx, store, shard, held.Holder(), opts)
		if err != nil {
			return nil, manifest.Manifest{}, err
		}
		if before != nil {
			if err := before(c.Prev, c.Epoch()); err != nil {
				return nil, manifest.Manifest{}, err
			}
		}
		o, err := Take(ctx, store, c, held, opts, nil)
		if errors.Is(err, manifest.ErrMoved) {
			continue
		}
		if err != nil {
			return nil, manifest.Manifest{}, err
		}
		return o, c.Prev, nil
	}
}

// Claim is a shard's manifest as a takeover found it: Inspect reads it, and Take
// publishes the takeover over it unless another write came between.
type Claim struct {
	// Prev is the manifest before the takeover.
	Prev manifest.Manifest
	// Expired reports a shard another instance owned and did not release, whose
	// lease ran out: that owner may still be running, and must be fenced from
	// whatever it writes outside the manifest (its tail) before that is read.
	Expired bool
	ver     substrate.Version
}

// Epoch is the owner epoch the takeover takes.
func (c Claim) Epoch() uint64 { return c.Prev.Epoch + 1 }

// Version is the authority's version of the manifest the claim read, empty for
// none: the only version Take's write can land on, even late.
func (c Claim) Version() substrate.Version { return c.ver }

// Inspect reads shard's manifest for a takeover by instance: at once when it is
// released, its owner's lease ended, or it is owned by the same instance (an
// earlier incarnation, which the caller knows is gone); otherwise after the
// lease's end with opts.Wait, or else ErrOwned.
//
// The owner's lease is read after the manifest, and judged by the time before
// the lease was read: a renewal that landed before that read is seen, and one that
// landed after it began only after the owner's validity ran out, which its
// ownership survives only by a write of the manifest; that write makes Take fail.
func Inspect(ctx context.Context, store *Store, shard, instance string, opts LeaseOptions) (Claim, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return Claim{}, err
	}
	for {
		m, ver, err := store.Load(ctx, shard)
		if err != nil {
			return Claim{}, err
		}
		held := !m.Released && m.Owner != "" && m.Owner != instance
		if !held {
			return Claim{Prev: m, ver: ver}, nil
		}
		at := opts.Clock.Now()
		live, expiry, err := store.ownerLive(ctx, m, at, opts)
		if err != nil {
			return Claim{}, err
		}
		if !live {
			return Claim{Prev: m, Expired: true, ver: ver}, nil
		}
		if !opts.Wait {
			return Claim{}, &manifest.OwnedError{Shard: shard, Owner: m.Owner, Expiry: expiry}
		}
		if err := sleep(ctx, opts.Clock, expiry.Add(opts.SkewMargin).Sub(opts.Clock.Now())); err != nil {
			return Claim{}, err
		}
	}
}

// ownerLive reports whether m's owner may still hold the shard, for a reader who
// read m and begins to read the owner's lease at at: its instance lease, of the
// acquisition m names (or of a later one that carries it), lives; or, for a
// manifest written before instance leases, the manifest's own lease. expiry is
// when that lease ends.
//
// An instance lease object that is gone from the manifest's own authority does not
// say its holder stopped: it may be valid by its last renewal, and acknowledging.
// It is written back as though renewed now, so that the shard is free only a whole
// lease later unless the holder renews it meanwhile.
func (s *Store) ownerLive(ctx context.Context, m manifest.Manifest, at time.Time, opts LeaseOptions) (live bool, expiry time.Time, err error) {
	if m.Lease == "" {
		return at.Before(m.LeaseExpiry.Add(opts.SkewMargin)), m.LeaseExpiry, nil
	}
	key := lease.InstanceKey(m.Owner)
	for range 2 {
		r, _, err := lease.Read(ctx, s.authority, key)
		if err != nil {
			return false, time.Time{}, fmt.Errorf("manifest %s: the owner's lease: %w", m.Shard, err)
		}
		if r.Holder == "" && m.Authority == s.name {
			if _, err := lease.Reinstate(ctx, s.authority, key, lease.Record{Holder: m.Owner, Token: m.Lease}, opts.LeaseOf()); err != nil {
				return false, time.Time{}, fmt.Errorf("manifest %s: the owner's lease is gone: %w", m.Shard, err)
			}
			continue // read what is there now
		}
		if r.Holder != m.Owner || !r.Holds(m.Lease) {
			return false, time.Time{}, nil // the instance released it and took a new one, or never held it here
		}
		return r.Live(at, opts.SkewMargin), r.Expiry, nil
	}
	return false, time.Time{}, fmt.Errorf("manifest %s: the owner's lease %s: gone again after it was written back", m.Shard, key)
}

// Take publishes the takeover of c under the instance lease held, by
// compare-and-swap: it bumps the epoch, which fences any earlier owner, names the
// lease, and sets the shard's tail pointer to tail. ErrMoved means another write
// came after c was read: inspect again. ErrUnknownOutcome means the takeover may
// have landed or may still land (on c.Version() only): the shard may be owned
// under held with no Owner to serve it.
func Take(ctx context.Context, store *Store, c Claim, held *lease.Held, opts LeaseOptions, tail *manifest.Tail) (*Owner, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	instance := held.Holder()
	gen, lerr := held.Valid()
	m := c.Prev.Clone()
	if a := store.authorityName(); m.Authority != a {
		if m.Epoch > 0 { // not a new shard: its history so far is another's, or unnamed
			m.Fork = &manifest.Fork{Authority: m.Authority, Epoch: m.Epoch, Seq: m.Seq}
		}
		m.Authority = a
	}
	m.Epoch = c.Epoch()
	m.Seq++
	m.Owner, m.Lease, m.Released, m.Backlog = instance, held.Token(), false, false
	m.LeaseExpiry = time.Time{}
	m.Tail = nil
	if tail != nil {
		t := *tail
		m.Tail = &t
	}
	newVer, data, err := store.publish(ctx, m, c.ver)
	if errors.Is(err, substrate.ErrPreconditionFailed) {
		// Another instance wrote first, or our write did and its reply was lost:
		// either way, look again.
		return nil, fmt.Errorf("manifest %s: take epoch %d: %w", m.Shard, m.Epoch, manifest.ErrMoved)
	}
	confirmed := err == nil && lerr == nil
	if err != nil {
		// The takeover may have landed with its reply lost: reading back tells.
		// What it finds may also be an earlier attempt's same bytes, landed
		// before the lease's generation began: it confirms nothing.
		_, curVer, landed, serr := store.settle(ctx, m, data)
		if serr != nil {
			return nil, fmt.Errorf("manifest %s: take epoch %d: %w", m.Shard, m.Epoch, errors.Join(manifest.ErrUnknownOutcome, err, serr))
		}
		if !landed {
			// Not there now; but a request still in flight may land later, on
			// the version it was sent for (c's), and no later write of this
			// takeover replaces it: the caller must treat the shard as possibly
			// taken.
			return nil, fmt.Errorf("manifest %s: take epoch %d: not there when read back, and may still land: %w", m.Shard, m.Epoch, errors.Join(manifest.ErrUnknownOutcome, err))
		}
		newVer = curVer
	}
	o := &Owner{store: store, instance: instance, lease: held, epoch: m.Epoch, opts: opts}
	o.published.Store(&m)
	o.validity.Store(&validity{})
	if confirmed {
		o.gen.Store(gen)
	}
	o.mu.ver = newVer
	return o, nil
}

func sleep(ctx context.Context, c clock.Clock, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.After(d):
		return nil
	}
}

// Settled reports whether the owner's view is the authority's manifest: false
// while a write of its may have landed unseen, until its next write reads the
// authority.
func (o *Owner) Settled() bool { return !o.doubt.Load() }

// Manifest returns a copy of the manifest as last published.
func (o *Owner) Manifest() manifest.Manifest { return o.published.Load().Clone() }

// Sealed returns the sealed watermark as last published.
func (o *Owner) Sealed() uint64 { return o.published.Load().Sealed }

// Epoch returns the owner's epoch.
func (o *Owner) Epoch() uint64 { return o.epoch }

// Valid reports whether the owner may acknowledge now: nil while its instance
// lease is valid in the generation the ownership was confirmed in; ErrLeaseExpired
// while it is not (Confirm, once the lease is renewed, brings it back);
// ErrFenced once another instance took over or the instance lease was lost;
// ErrReleased after Release.
func (o *Owner) Valid() error {
	if err := o.validity.Load().err; err != nil {
		return err
	}
	gen, err := o.lease.Valid()
	switch {
	case errors.Is(err, lease.ErrExpired):
		return fmt.Errorf("manifest %s: epoch %d: %w", o.published.Load().Shard, o.epoch, errors.Join(manifest.ErrLeaseExpired, err))
	case err != nil:
		return fmt.Errorf("manifest %s: epoch %d: %w", o.published.Load().Shard, o.epoch, errors.Join(manifest.ErrFenced, err))
	case gen != o.gen.Load():
		return fmt.Errorf("manifest %s: epoch %d: the instance lease lapsed since the ownership was confirmed: %w", o.published.Load().Shard, o.epoch, manifest.ErrLeaseExpired)
	}
	return nil
}

// Fenced reports whether the ownership ended for good: another instance took the
// shard over (as far as this owner has seen), it was released, or the instance
// lease is gone. An ownership that waits only for its lease to be renewed, or
// confirmed in the lease's new generation, is not fenced.
func (o *Owner) Fenced() bool {
	err := o.Valid()
	return err != nil && !errors.Is(err, manifest.ErrLeaseExpired)
}

// Superseded reports whether another instance may own the shard now, by this
// owner's clock: it is fenced, or its lease ran out unrenewed. From the lease's
// expiry by this clock on, an instance whose clock is up to the skew margin ahead
// may take the shard over.
func (o *Owner) Superseded() bool {
	err := o.Valid()
	switch {
	case err == nil:
		return false
	case !errors.Is(err, manifest.ErrLeaseExpired):
		return true
	}
	return !o.opts.Clock.Now().Before(o.lease.Renewed().Add(o.opts.Duration))
}

// Lapsed reports whether the owner is valid but for a confirmation: its instance
// lease is valid in a later generation than the ownership was confirmed in.
func (o *Owner) Lapsed() bool {
	if o.validity.Load().err != nil {
		return false
	}
	gen, err := o.lease.Valid()
	return err == nil && gen != o.gen.Load()
}

// stop makes every later call fail with err.
func (o *Owner) stop(err error) error {
	o.validity.Store(&validity{err: err})
	return err
}

// Confirm writes the manifest unchanged, by compare-and-swap: that settles a write
// in doubt, and, after the instance lease lapsed and was renewed, confirms the
// ownership in the lease's new generation (a takeover that read the manifest
// before fails to publish). After the epoch moved every call fails with ErrFenced.
func (o *Owner) Confirm(ctx context.Context) error {
	return o.update(ctx, func(*manifest.Manifest) error { return nil })
}

// Commit adds a sealed part, which must start at the sealed watermark. It is idempotent: a part whose key the manifest already holds (an earlier
// attempt whose reply was lost) is success. A nil error means the part is in the
// authority's manifest.
func (o *Owner) Commit(ctx context.Context, p manifest.Part) error {
	return o.commit(ctx, p, func(*manifest.Tail) {})
}

// CommitTail is Commit that also advances the tail pointer to (incarnation,
// from), a position in the owner's tail from which on its objects hold every
// record of the shard past the part, if the pointer names the owner's tail and
// that moves it forward: a takeover then reads fewer objects, and collection
// keeps fewer.
func (o *Owner) CommitTail(ctx context.Context, p manifest.Part, incarnation, from uint64) error {
	return o.commit(ctx, p, func(t *manifest.Tail) {
		if t != nil && t.Instance == o.instance && before(t.Incarnation, t.From, incarnation, from) {
			t.Incarnation, t.From = incarnation, from
		}
	})
}

func (o *Owner) commit(ctx context.Context, p manifest.Part, advance func(*manifest.Tail)) error {
	return o.update(ctx, func(m *manifest.Manifest) error {
		advance(m.Tail)
		if slices.ContainsFunc(m.Parts, func(q manifest.Part) bool { return q.Key == p.Key }) {
			return errAlreadyDone
		}
		if p.First != m.Sealed {
			return fmt.Errorf("manifest %s: part %s starts at %d, the sealed watermark is %d: %w", m.Shard, p.Key, p.First, m.Sealed, manifest.ErrConflict)
		}
		m.Parts = append(m.Parts, p)
		m.Sealed = p.Next()
		return nil
	})
}

// AddReplica records that replica holds the part under key, and publishes the
// manifest to every substrate. Recording a replica the part already names is
// success; a part the manifest does not name is ErrUnknownPart.
//
// Concurrent calls are published together: while one publish is in flight the
// others queue, and the next publish carries all of them, so a backfill of many
// parts costs a few manifest writes, not one per copy.
func (o *Owner) AddReplica(ctx context.Context, key, replica string) error {
	req := &replicaAdd{key: key, replica: replica, done: make(chan error, 1)}
	o.adds.Lock()
	o.adds.queue = append(o.adds.queue, req)
	o.adds.Unlock()

	o.mu.Lock()
	o.adds.Lock()
	batch := o.adds.queue
	o.adds.queue = nil
	o.adds.Unlock()
	if len(batch) > 0 { // else a publish before this one carried req
		errs := make([]error, len(batch))
		err := o.updateLocked(ctx, func(m *manifest.Manifest) error {
			changed := false
			for i, r := range batch {
				errs[i] = nil
				j := slices.IndexFunc(m.Parts, func(p manifest.Part) bool { return p.Key == r.key })
				switch {
				case j < 0:
					errs[i] = fmt.Errorf("manifest %s: part %s: %w", m.Shard, r.key, manifest.ErrUnknownPart)
				case !slices.Contains(m.Parts[j].Replicas, r.replica):
					m.Parts[j].Replicas = append(m.Parts[j].Replicas, r.replica)
					changed = true
				}
			}
			if !changed {
				return errAlreadyDone
			}
			return nil
		})
		for i, r := range batch {
			if errs[i] == nil {
				errs[i] = err
			}
			r.done <- errs[i]
		}
	}
	o.mu.Unlock()
	return <-req.done
}

// replicaAdd is one AddReplica waiting to be published.
type replicaAdd struct {
	key, replica string
	done         chan error
}

// maxConflicts bounds the reload-and-retry of one update: only an ambiguous write of
// our own can cause a conflict without fencing us, so more than a few is a bug.
const maxConflicts = 8

// Release gives the shard up, so the next Acquire takes over at once. Every later
// call fails with ErrReleased.
func (o *Owner) Release(ctx context.Context) error { return o.release(ctx, false, 0, 0) }

// ReleaseWithBacklog is Release by an owner that leaves records past the sealed
// watermark in its WAL, and shipped them in its tail, in the objects before
// sequence until of incarnation; the manifest says so (Backlog, Tail.Until), so
// that no copy takes the released history for one that lost nothing, and the
// next owner reads the tail to there without fencing it. An end before the
// pointer's start, or in another instance's tail, is not recorded: the next
// owner then fences the tail and reads it to the fence.
func (o *Owner) ReleaseWithBacklog(ctx context.Context, incarnation, until uint64) error {
	return o.release(ctx, true, incarnation, until)
}

func (o *Owner) release(ctx context.Context, backlog bool, incarnation, until uint64) error {
	err := o.update(ctx, func(m *manifest.Manifest) error {
		m.Released, m.Backlog, m.LeaseExpiry = true, backlog, time.Time{}
		switch t := m.Tail; {
		case !backlog:
			m.Tail = nil // everything is sealed: no tail to read
		case t != nil && t.Instance == o.instance && until > 0 && !before(incarnation, until, t.Incarnation, t.From):
			t.Until, t.UntilIncarnation = until, 0
			if incarnation != t.Incarnation {
				t.UntilIncarnation = incarnation
			}
		}
		return nil
	})
	if err == nil {
		o.stop(fmt.Errorf("manifest %s: %w", o.published.Load().Shard, manifest.ErrReleased))
	}
	return err
}

// Fence stops the owner, as a takeover elsewhere does: every later call fails
// with ErrFenced. The owner's tail learned that another instance took the
// shard over at this epoch.
func (o *Owner) Fence(why string) {
	o.stop(fmt.Errorf("manifest %s: %w: %s", o.published.Load().Shard, manifest.ErrFenced, why))
}

// update applies change to the manifest and publishes it by compare-and-swap; a
// publish that began while the instance lease was valid confirms the ownership in
// that lease's generation. On a precondition failure it reloads: a moved epoch
// fences the owner for good; otherwise (a write of ours whose reply was lost) it
// applies change again to what it found.
func (o *Owner) update(ctx context.Context, change func(*manifest.Manifest) error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.updateLocked(ctx, change)
}

// updateLocked is update with o.mu held.
func (o *Owner) updateLocked(ctx context.Context, change func(*manifest.Manifest) error) error {
	if err := o.validity.Load().err; err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		if attempt == maxConflicts {
			return fmt.Errorf("manifest %s: %d conflicting writes by this owner's own instance", o.published.Load().Shard, attempt)
		}
		m := o.published.Load().Clone()
		if err := change(&m); errors.Is(err, errAlreadyDone) {
			return nil
		} else if err != nil {
			return err
		}
		gen, lerr := o.lease.Valid()
		m.Seq++
		ver, data, err := o.store.publish(ctx, m, o.mu.ver)
		if err == nil {
			o.publishedLocked(m, ver)
			if lerr == nil {
				// It landed after it began, in the lease's generation gen: a
				// takeover that read the manifest before fails to publish.
				o.gen.Store(gen)
			}
			return nil
		}
		// A precondition failure is another write first (a new owner's, or ours
		// whose reply was lost); any other error may have landed too. Either way
		// the authority tells.
		cur, curVer, landed, lerr := o.store.settle(ctx, m, data)
		if lerr != nil {
			o.doubt.Store(true)
			return fmt.Errorf("manifest %s: publish: %w", m.Shard, errors.Join(manifest.ErrUnknownOutcome, err, lerr))
		}
		// The authority was read: what follows is what it holds.
		o.doubt.Store(false)
		if landed {
			// The reply was lost, or a client's retry found its own write; or an
			// earlier write of the same bytes landed (a Confirm whose outcome was
			// unknown), perhaps before the lease's current generation began: this
			// one cannot confirm the ownership.
			o.publishedLocked(cur, curVer)
			return nil
		}
		if cur.Epoch != o.epoch || cur.Owner != o.instance {
			return o.stop(fmt.Errorf("manifest %s: epoch %d, now %d owned by %q: %w", m.Shard, o.epoch, cur.Epoch, cur.Owner, manifest.ErrFenced))
		}
		if !errors.Is(err, substrate.ErrPreconditionFailed) {
			// Not there now; a request still in flight could land later, but only
			// on the version it was sent for, which the next write replaces.
			o.mu.ver = curVer
			o.published.Store(&cur)
			return fmt.Errorf("manifest %s: publish: %w", m.Shard, errors.Join(manifest.ErrUnknownOutcome, err))
		}
		o.mu.ver = curVer
		o.published.Store(&cur)
	}
}

// publishedLocked makes m, which the authority holds at ver, the owner's view.
func (o *Owner) publishedLocked(m manifest.Manifest, ver substrate.Version) {
	o.mu.ver = ver
	o.published.Store(&m)
	o.doubt.Store(false)
}

// WaitCopies waits until every other substrate holds the manifest as this owner
// last published it, or a newer one; or an attempt at a copy failed (its error);
// or ctx ended. Publishes never wait for the copies; a Close that hands the shard
// over does.
func (o *Owner) WaitCopies(ctx context.Context) error {
	m := o.published.Load()
	return o.store.waitCopies(ctx, m.Shard, m.Seq)
}
