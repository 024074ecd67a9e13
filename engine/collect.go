package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
)

// collectTail deletes, every Tail.CollectEvery until the engine closes, the
// objects of this instance's tail streams that no shard needs any more.
func (e *Engine) collectTail() {
	defer close(e.collector.done)
	for {
		select {
		case <-e.stop:
			return
		case <-e.opts.Clock.After(e.opts.Tail.CollectEvery):
		}
		// A pass may take longer than the interval (the next starts later); a
		// bound as tight as a test's interval cut deletes short after they
		// landed, uncounted.
		ctx, cancel := context.WithTimeout(e.closing, max(e.opts.Tail.CollectEvery, collectPassBound))
		if _, err := e.collectTailOnce(ctx); err != nil && ctx.Err() == nil {
			e.opts.Logger.Warn("engine: tail collection", "err", err)
		}
		cancel()
	}
}

// collectPassBound is the least time a collection pass may take before it is cut.
const collectPassBound = 30 * time.Second

// collectTailOnce is one pass of collection over every incarnation of this
// instance's stream: each loses the objects at its start that hold no section a
// shard needs (see tail.Collect). A section is needed while the shard's manifest
// points at it — its stream, at or past the pointer, before the recorded end — and
// it is of the manifest's epoch and not sealed; or while it is of a later epoch than
// the manifest's (a takeover that shipped its backlog and has not published yet),
// or of a shard this engine owns, in its live stream, not sealed (a move to a new
// incarnation that has not pointed the manifest there yet).
// It returns how many objects it deleted.
func (e *Engine) collectTailOnce(ctx context.Context) (int, error) {
	spec, _ := e.set.Get(e.tail.replica)
	b := spec.Bucket
	streams, err := tail.Streams(ctx, b, e.opts.Instance)
	if err != nil {
		return 0, err
	}
	owners, _ := e.owners()
	manifests := map[string]manifest.Manifest{}
	manifestOf := func(shard string) (manifest.Manifest, error) {
		if m, ok := manifests[shard]; ok {
			return m, nil
		}
		var m manifest.Manifest
		// The owner's view is the authority's while it holds the lease, unless a
		// write of its may have landed unseen (a move's PointTail whose reply was
		// lost): then the authority may point elsewhere already.
		if o, ok := owners[shard]; ok && o.Valid() == nil && o.Settled() {
			m = o.Manifest()
		} else if m, _, err = e.store.Load(ctx, shard); err != nil {
			return manifest.Manifest{}, err
		}
		manifests[shard] = m
		return m, nil
	}
	now := e.opts.Clock.Now()
	seen := map[string]time.Time{} // this pass's: the keys it looked at
	old := func(key string) bool {
		first, ok := e.collector.seen[key]
		if !ok {
			first = now
		}
		seen[key] = first
		return now.Sub(first) >= e.opts.Tail.CollectAfter
	}
	live := e.tail.cur.Load().incarnation
	total := 0
	var errs []error
	for _, st := range streams {
		inc := st.Incarnation
		needed := func(seq uint64, s tail.Entry) (bool, error) {
			m, err := manifestOf(s.Shard)
			if err != nil {
				return true, err
			}
			if s.Epoch > m.Epoch {
				return true, nil
			}
			// A shard of this engine's moving to its live stream (after a fence)
			// has shipped its backlog there before its manifest points there.
			if o, ok := owners[s.Shard]; ok && inc == live && s.Epoch == o.Epoch() && s.Next > o.Sealed() {
				return true, nil
			}
			t := m.Tail
			if t == nil || t.Instance != e.opts.Instance || t.Incarnation != inc || seq < t.From || (t.Until != 0 && seq >= t.Until) {
				return false, nil // superseded: no reader of the shard looks here
			}
			return s.Epoch == m.Epoch && s.Next > m.Sealed, nil
		}
		n, err := tail.Collect(ctx, b, st, inc == live, old, needed)
		total += n
		e.metrics.collected.Add(float64(n))
		if err != nil {
			errs = append(errs, fmt.Errorf("engine: collect tail incarnation %d: %w", inc, err))
		}
	}
	// The keys this pass did not look at were deleted, or lie past an object it
	// kept; the latter are seen anew, later, which only delays them.
	e.collector.seen = seen
	return total, errors.Join(errs...)
}
