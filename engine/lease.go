package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// instanceLease is the engine's one lease: every shard it owns names it in its
// manifest, and is owned while it lives. It is taken at the first takeover (Open
// needs no object store), renewed every RenewEvery by one conditional write
// whatever the number of shards, and released at Close.
type instanceLease struct {
	mu       sync.Mutex
	held     *lease.Held
	acquired chan struct{} // closed once held is set
	// orphans are shards whose manifests may name the lease while this engine
	// has them open nowhere: a takeover of unknown outcome, or an open whose
	// retirement failed. Nobody else could take them while the lease lives; each
	// renewal gives them back (releaseOrphans).
	orphans struct {
		sync.WaitGroup // the pass in flight
		mu             sync.Mutex
		ids            map[string]orphan
		running        bool
		closed         bool        // Close began: no pass starts
		retry          func() bool // stops the next pass's timer
	}
}

// lease returns the engine's instance lease, taking it on the first call. The
// lease is the instance's own: an earlier holder of it is this Dir's previous
// engine, gone (the WAL's lock says so). Unless that engine released it, the new
// acquisition carries its token, so that the shards it owned stay owned, and
// nobody else takes one over (fencing its tail, where Local mode's unshipped
// records are not) while its pages are here: each shard this Dir's WAL knows is
// kept as an orphan, given back after a renewal unless it is opened again first,
// and once none is left the token is let go (uncarry).
func (e *Engine) lease(ctx context.Context) (*lease.Held, error) {
	e.inst.mu.Lock()
	defer e.inst.mu.Unlock()
	if h := e.inst.held; h != nil {
		_, err := h.Valid()
		switch {
		case errors.Is(err, lease.ErrExpired):
			// Renewals failed, or the clock jumped: a takeover under an expired
			// lease would only be confirmed at the next renewal.
			if err := e.renew(ctx, h); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, fmt.Errorf("engine: instance %q's lease: %w", e.opts.Instance, err)
		}
		return h, nil
	}
	h, err := lease.Continue(ctx, e.store.Authority(), lease.InstanceKey(e.opts.Instance), e.opts.Instance, nil, e.opts.ownership().LeaseOf())
	if err != nil {
		return nil, fmt.Errorf("engine: the instance lease: %w", err)
	}
	for _, id := range e.log.Known() {
		e.orphaned(id)
	}
	e.inst.held = h
	close(e.inst.acquired)
	return h, nil
}

// heldLease returns the instance lease if it was taken.
func (e *Engine) heldLease() *lease.Held {
	e.inst.mu.Lock()
	defer e.inst.mu.Unlock()
	return e.inst.held
}

// renewLease renews the instance lease RenewEvery after its previous renewal
// began, however long that one took, and sooner after a failure. A renewal that
// completes after the lease ran out starts a new generation of it: every owned
// shard's ownership is then confirmed by a write of its manifest before it
// acknowledges again (see ownership.Owner.Confirm).
func (e *Engine) renewLease() {
	defer close(e.done)
	select {
	case <-e.stop:
		return
	case <-e.inst.acquired:
	}
	h := e.heldLease()
	due := h.Renewed().Add(e.opts.RenewEvery)
	for {
		select {
		case <-e.stop:
			return
		case <-e.opts.Clock.After(due.Sub(e.opts.Clock.Now())):
		}
		ctx, cancel := context.WithTimeout(context.Background(), e.opts.RenewEvery)
		err := e.renew(ctx, h)
		switch {
		case errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrReleased):
			cancel()
			e.opts.Logger.Error("engine: the instance lease is gone: every shard is fenced", "err", err)
			return
		case err != nil:
			e.opts.Logger.Warn("engine: instance lease renewal failed", "err", err)
			due = e.opts.Clock.Now().Add(e.opts.RenewEvery / renewRetries)
		default:
			due = h.Renewed().Add(e.opts.RenewEvery)
			e.releaseOrphans()
		}
		cancel()
	}
}

// renew renews the instance lease h, then confirms every ownership a lapse left
// unconfirmed.
func (e *Engine) renew(ctx context.Context, h *lease.Held) error {
	if err := h.Renew(ctx); err != nil {
		return err
	}
	e.confirmLapsed(ctx)
	return nil
}

// orphan is why a shard may be owned under the lease and open nowhere.
type orphan struct {
	// inFlight is set for a takeover of unknown outcome: its write may land
	// later, on the manifest's version sentFor (empty: no manifest), and only
	// there.
	inFlight bool
	sentFor  substrate.Version
}

// orphaned records that shard id may be owned under the lease and open nowhere.
func (e *Engine) orphaned(id string) {
	e.addOrphan(id, orphan{}, false)
}

// takeoverOrphaned records that a takeover of shard id, whose write was sent for
// the manifest's version sentFor, may have landed or may still land.
func (e *Engine) takeoverOrphaned(id string, sentFor substrate.Version) {
	e.addOrphan(id, orphan{inFlight: true, sentFor: sentFor}, true)
}

func (e *Engine) addOrphan(id string, or orphan, replace bool) {
	o := &e.inst.orphans
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ids == nil {
		o.ids = map[string]orphan{}
	}
	if _, ok := o.ids[id]; ok && !replace {
		return // a takeover's write in flight is the stronger reason
	}
	o.ids[id] = or
}

// GiveBack gives shard id back — releases it under this engine's lease — when a
// handoff of it failed and left it leased and open nowhere: at once if it can, or
// after a later renewal. A shard open here again, or not this engine's any more,
// is left as it is.
func (e *Engine) GiveBack(id string) {
	e.orphaned(id)
	e.releaseOrphans()
}

// releaseOrphans starts giving the orphans back, unless a pass is running: each
// not open here is opened (its own manifest names this instance: at once) and
// retired, which releases it with whatever it holds unsealed recorded for the
// next owner. One that cannot be yet stays for the next renewal.
func (e *Engine) releaseOrphans() {
	o := &e.inst.orphans
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.running || o.closed {
		return
	}
	o.running = true
	ids := maps.Clone(o.ids)
	o.Add(1)
	go func() {
		defer o.Done()
		for _, id := range slices.Sorted(maps.Keys(ids)) {
			done := e.releaseOrphan(id, ids[id])
			o.mu.Lock()
			if done && o.ids[id] == ids[id] { // not recorded again meanwhile
				delete(o.ids, id)
			}
			o.mu.Unlock()
		}
		o.mu.Lock()
		settled := len(o.ids) == 0
		o.mu.Unlock()
		if settled {
			e.uncarry()
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		o.running = false
		if len(o.ids) > 0 && !o.closed {
			// Again soon, besides after each renewal: a handoff that failed
			// for a moment should not hold its shard for a whole interval.
			o.retry = e.opts.Clock.AfterFunc(min(time.Second, e.opts.RenewEvery), e.releaseOrphans)
		}
	}()
}

// uncarry lets the previous engine's lease tokens go once every shard this Dir's
// WAL knew at the restart is settled: a shard still owned under one of them is
// one whose pages are not here (a restored Dir's, or one the WAL no longer
// knew), and is free from then on.
func (e *Engine) uncarry() {
	h := e.heldLease()
	if h == nil || !h.Carries() {
		return
	}
	ctx, cancel := context.WithTimeout(e.closing, e.opts.Lease.Duration)
	defer cancel()
	if err := h.Uncarry(ctx); err != nil {
		e.opts.Logger.Warn("engine: letting the previous engine's lease go", "err", err)
	}
}

// stopOrphans ends the releases of orphans at Close: none starts any more, and
// the one in flight is waited for.
func (e *Engine) stopOrphans() {
	o := &e.inst.orphans
	o.mu.Lock()
	o.closed = true
	if o.retry != nil {
		o.retry()
	}
	o.mu.Unlock()
	o.Wait()
}

// releaseOrphan gives one orphan back, and reports whether it is settled: given
// back, open here again, or another's. A takeover's write that may still land (the
// manifest is still at the version it was sent for) is settled by taking the
// shard, which moves the manifest past that version, and giving it back; until
// then the orphan is kept, whatever the manifest says now.
func (e *Engine) releaseOrphan(id string, or orphan) bool {
	ctx, cancel := context.WithTimeout(e.closing, e.opts.Lease.Duration)
	defer cancel()
	if owners, _ := e.owners(); owners[id] != nil {
		return true // open here again
	}
	m, ver, err := e.store.Load(ctx, id)
	if err != nil {
		return false
	}
	pending := or.inFlight && ver == or.sentFor
	if h := e.heldLease(); !pending && (m.Released || h == nil || m.Owner != e.opts.Instance || !h.Holds(m.Lease)) {
		return true // given back already, or never taken, or another's
	}
	sh, err := e.OpenShard(ctx, id)
	switch {
	case errors.Is(err, ErrShardOpen):
		// Open here, or an open in flight that may yet fail: the next pass
		// finds it open (settled) or tries again.
		return false
	case errors.Is(err, ErrOwned):
		// Another's now; but while the write may still land, it may yet name
		// this lease.
		return !pending
	case err != nil:
		e.opts.Logger.Warn("engine: giving back a shard a failed open left owned", "shard", id, "err", err)
		return false
	}
	if err := sh.Retire(ctx); err != nil {
		e.opts.Logger.Warn("engine: giving back a shard a failed open left owned", "shard", id, "err", err)
		return false
	}
	return true
}

// renewRetries is how many times a failed renewal is tried within RenewEvery.
const renewRetries = 5

// confirmLapsed confirms every ownership the instance lease's new generation left
// unconfirmed, renewConcurrency at a time.
func (e *Engine) confirmLapsed(ctx context.Context) {
	owners, _ := e.owners()
	sem := make(chan struct{}, renewConcurrency)
	var wg sync.WaitGroup
	for id, o := range owners {
		if !o.Lapsed() {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := o.Confirm(ctx); err != nil && !errors.Is(err, manifest.ErrReleased) {
				e.opts.Logger.Warn("engine: confirming a shard after the lease lapsed", "shard", id, "err", err)
			}
		})
	}
	wg.Wait()
}

// releaseLease gives the instance lease up at Close, after every shard was closed
// or retired, unless one kept its lease (kept).
// A release that fails is logged: the lease runs out at its time, and the shards
// released already are anyone's.
func (e *Engine) releaseLease(ctx context.Context, kept bool) {
	h := e.heldLease()
	if h == nil {
		return
	}
	if kept {
		// A shard kept its lease (its pages could not be shipped): released,
		// the instance lease would free it at once, and the next owner would
		// read its tail without them. It runs out instead, unless this Dir's
		// next engine continues it first.
		e.opts.Logger.Warn("engine: close: a shard kept its lease, so the instance lease is not released; it runs out")
		return
	}
	if err := h.Release(ctx); err != nil && !errors.Is(err, lease.ErrLost) {
		e.opts.Logger.Warn("engine: close: the instance lease was not released; it runs out", "err", err)
	}
}

// Attributes returns the attributes the engine's instance lease publishes: what
// a fleet, or anyone listing the instances, reads of this one. It is nil until
// the lease is taken (by the first OpenShard, or SetAttributes).
func (e *Engine) Attributes() map[string]string {
	if h := e.heldLease(); h != nil {
		return h.Attrs()
	}
	return nil
}

// SetAttributes replaces the attributes the engine's instance lease publishes,
// taking the lease if no open has yet, and returns once they are written. The
// engine keeps them through its renewals until Close.
func (e *Engine) SetAttributes(ctx context.Context, attrs map[string]string) error {
	e.mu.Lock()
	closed := e.mu.closed
	e.mu.Unlock()
	if closed {
		return ErrClosed
	}
	h, err := e.lease(ctx)
	if err != nil {
		return err
	}
	// The write holds the lease's lock, which the renewals wait for: bounded
	// by a renewal interval, a stalled store cannot hold them off longer.
	ctx, cancel := context.WithTimeout(ctx, e.opts.RenewEvery)
	defer cancel()
	return h.SetAttrs(ctx, attrs)
}

// Err reports why the engine acknowledges nothing now: ErrClosed once Close
// began, or ErrInstanceLost once another process wrote over its instance lease,
// both for good; or, while its instance lease has lapsed (renewals failed), an
// error that is ErrFenced (manifest.ErrLeaseExpired), until a renewal succeeds. It
// is nil otherwise.
func (e *Engine) Err() error {
	e.mu.Lock()
	closed := e.mu.closed
	e.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if h := e.heldLease(); h != nil {
		_, err := h.Valid()
		switch {
		case errors.Is(err, lease.ErrReleased):
			return ErrClosed
		case errors.Is(err, lease.ErrLost):
			return fmt.Errorf("%w: %w", ErrInstanceLost, err)
		case err != nil:
			return fmt.Errorf("engine: the instance lease: %w: %w", manifest.ErrLeaseExpired, err)
		}
	}
	return nil
}

// Authority is the replica the engine's manifests and lease are on.
func (e *Engine) Authority() *substrate.Bucket { return e.store.Authority() }

// deadInstances are the instances whose tails this engine's collection also
// collects: those whose instance lease was released, or ran out more than
// CollectAfter ago, by this engine's clock and the skew margin.
func (e *Engine) deadInstances(ctx context.Context) ([]string, error) {
	recs, _, err := lease.ListAll(ctx, e.set.Authority().Bucket, lease.InstancesPrefix, "/lease")
	if err != nil {
		return nil, err
	}
	now := e.opts.Clock.Now()
	var dead []string
	for key, r := range recs {
		id := strings.TrimSuffix(strings.TrimPrefix(key, lease.InstancesPrefix), "/lease")
		if id == e.opts.Instance || strings.Contains(id, "/") {
			continue
		}
		if r.Released || now.After(r.Expiry.Add(e.opts.Lease.SkewMargin+e.opts.Tail.CollectAfter)) {
			dead = append(dead, id)
		}
	}
	sort.Strings(dead)
	return dead, nil
}
