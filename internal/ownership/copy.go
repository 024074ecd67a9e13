package ownership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// A copier keeps one substrate's copies of the manifests up to date with what the
// authority published, in the background, so that no publish (a renewal, a commit,
// an append's lease) waits on a replica that is slow or unreachable.
//
// A copy never moves a replica back. Every publish carries a sequence number one
// past the manifest it replaces, so a shard's manifests are totally ordered by
// (epoch, sequence) across owners and instances; a copy is a conditional write on
// the replica's current version, made only while what the replica holds is older.
// An owner whose copy was delayed (a slow region, a retried request) finds the next
// owner's newer manifest there and leaves it. The newest manifest handed over for a
// shard replaces any older one still waiting: a replica is brought to the newest
// state, not through every state.
type copier struct {
	b    *substrate.Bucket
	opts StoreOptions

	mu struct {
		sync.Mutex
		closed  bool
		workers int
		shards  map[string]*copyState
		queue   []string                  // shards with a newer manifest to copy and no copy in flight
		timers  map[*func() bool]struct{} // the retries pending, by their stop
	}
	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // workers
}

// copyState is one shard's copy on one substrate.
type copyState struct {
	want     manifest.Manifest // newest published; want.Seq > landed while a copy is due
	data     []byte            // want's encoding
	landed   uint64            // sequence known to be on the substrate, ours or newer
	ver      substrate.Version
	inflight bool
	queued   bool
	err      error         // the last attempt's, nil after a success
	changed  chan struct{} // closed and replaced when an attempt ends
}

func newCopier(b *substrate.Bucket, opts StoreOptions) *copier {
	c := &copier{b: b, opts: opts}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.shards = make(map[string]*copyState)
	c.mu.timers = make(map[*func() bool]struct{})
	return c
}

// offer hands over a manifest the authority now holds.
func (c *copier) offer(m manifest.Manifest, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return
	}
	st := c.stateLocked(m.Shard)
	if !m.After(st.want) {
		return
	}
	st.want, st.data = m, data
	c.enqueueLocked(m.Shard, st)
}

func (c *copier) stateLocked(shard string) *copyState {
	st, ok := c.mu.shards[shard]
	if !ok {
		st = &copyState{changed: make(chan struct{})}
		c.mu.shards[shard] = st
	}
	return st
}

// enqueueLocked queues the shard's copy unless one is in flight (it requeues the
// shard when it ends) and starts a worker if fewer than copyWorkers run.
func (c *copier) enqueueLocked(shard string, st *copyState) {
	if st.inflight || st.queued || st.want.Seq <= st.landed {
		return
	}
	st.queued = true
	c.mu.queue = append(c.mu.queue, shard)
	if c.mu.workers < copyWorkers {
		c.mu.workers++
		c.wg.Add(1)
		go c.work()
	}
}

// copyWorkers bounds the copies in flight per substrate.
const copyWorkers = 8

// work copies until the queue is empty, then exits: an idle copier holds no
// goroutine.
func (c *copier) work() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		if len(c.mu.queue) == 0 || c.mu.closed {
			c.mu.workers--
			c.mu.Unlock()
			return
		}
		shard := c.mu.queue[0]
		c.mu.queue = c.mu.queue[1:]
		st := c.mu.shards[shard]
		st.queued, st.inflight = false, true
		want, data, ver := st.want, st.data, st.ver
		c.mu.Unlock()

		ctx, cancel := context.WithTimeout(c.ctx, c.opts.CopyTimeout)
		landed, newVer, err := c.copy(ctx, want, data, ver)
		cancel()

		c.mu.Lock()
		st.inflight = false
		st.landed, st.ver, st.err = max(st.landed, landed), newVer, err
		close(st.changed)
		st.changed = make(chan struct{})
		switch {
		case c.mu.closed:
		case err != nil:
			c.opts.Logger.Warn("manifest: copy to a replica failed; retrying", "shard", shard, "replica", c.b.Name(), "err", err)
			c.retryLocked(shard)
		case st.want.Seq > st.landed:
			c.enqueueLocked(shard, st) // a newer manifest came while this one was copied
		}
		c.mu.Unlock()
	}
}

// retryLocked queues the shard again after a pause.
func (c *copier) retryLocked(shard string) {
	t := new(func() bool)
	*t = c.opts.Clock.AfterFunc(copyRetryDelay, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.mu.timers, t)
		if st := c.mu.shards[shard]; !c.mu.closed && st != nil {
			c.enqueueLocked(shard, st)
		}
	})
	c.mu.timers[t] = struct{}{}
}

// copyRetryDelay is the pause before a failed copy is tried again.
const copyRetryDelay = time.Second

// copy writes m to the substrate unless it holds m or a newer manifest already. ver
// is the version this copier last saw there ("" if none); it returns the sequence
// now known to be there and its version.
func (c *copier) copy(ctx context.Context, m manifest.Manifest, data []byte, ver substrate.Version) (uint64, substrate.Version, error) {
	key := manifest.Key(m.Shard)
	for attempt := 0; attempt < maxConflicts; attempt++ {
		var attrs substrate.Attrs
		var err error
		if ver == "" {
			var created bool
			attrs, created, err = c.b.PutIfAbsentBytes(ctx, key, data)
			if err == nil && !created {
				err = substrate.ErrPreconditionFailed
			}
		} else {
			attrs, err = c.b.CompareAndSwapBytes(ctx, key, ver, data)
		}
		if err == nil {
			return m.Seq, attrs.Version, nil
		}
		// Anything but a precondition failure may still have landed (a lost reply):
		// reading back tells, as a conflict does.
		cur, curVer, raw, lerr := manifest.Read(ctx, c.b, m.Shard)
		if lerr != nil {
			return 0, "", fmt.Errorf("manifest %s: copy to %s: %w", m.Shard, c.b.Name(), errors.Join(err, lerr))
		}
		if !errors.Is(err, substrate.ErrPreconditionFailed) && curVer == ver {
			return 0, ver, fmt.Errorf("manifest %s: copy to %s: %w", m.Shard, c.b.Name(), err)
		}
		switch {
		case curVer == "":
		case cur.Epoch == m.Epoch && cur.Seq == m.Seq && bytes.Equal(raw, data):
			return m.Seq, curVer, nil // ours
		case cur.Descends(m):
			// A newer manifest of this history (or of one that took over from it
			// after m) holds the replica: never move it back. Its version is not
			// kept: the next copy must read what is there again.
			return m.Seq, "", nil
		case (!m.Descends(cur) || cur.Epoch == m.Epoch && cur.Owner != m.Owner) && !(cur.Released && !cur.Backlog && cur.Epoch <= m.Epoch && partsPrefix(cur.Parts, m.Parts)):
			// The replica holds a history that is not m's past: it was used as an
			// authority of its own (a cold open from it alone) while this one
			// lived. Neither is older; overwriting would drop what it committed,
			// or what it acknowledged and has not sealed (while its owner holds
			// the lease, or after a release with a backlog), or the epochs it
			// took (its owner's WAL knows them). A released history that left
			// nothing of its own behind, such as a cold read's, loses nothing:
			// m overwrites it. No version is kept, so no later copy swaps on it.
			return 0, "", fmt.Errorf("manifest %s: copy to %s: %q holds epoch %d seq %d of %q there, %q epoch %d seq %d of %q here: %w",
				m.Shard, c.b.Name(), cur.Owner, cur.Epoch, cur.Seq, cur.Authority, m.Owner, m.Epoch, m.Seq, m.Authority, manifest.ErrDiverged)
		}
		ver = curVer
	}
	return 0, "", fmt.Errorf("manifest %s: copy to %s: %d conflicting writes", m.Shard, c.b.Name(), maxConflicts)
}

// partsPrefix reports whether a's parts are the first of b's.
func partsPrefix(a, b []manifest.Part) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key {
			return false
		}
	}
	return true
}

// wait returns once the substrate holds shard's manifest of sequence seq or a
// newer one, or ctx ended, or the copy failed waitAttempts attempts in a row (the
// last error): a replica that is down for a moment does not cut a handover short,
// and one that stays down does not hold it forever.
func (c *copier) wait(ctx context.Context, shard string, seq uint64) error {
	failed := 0
	for {
		c.mu.Lock()
		st, ok := c.mu.shards[shard]
		if !ok || st.landed >= seq {
			c.mu.Unlock()
			return nil
		}
		if c.mu.closed {
			c.mu.Unlock()
			return fmt.Errorf("manifest %s: the copy to %s was dropped: %w", shard, c.b.Name(), manifest.ErrClosed)
		}
		ch := st.changed
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("manifest %s: waiting for the copy to %s: %w", shard, c.b.Name(), ctx.Err())
		case <-ch:
		}
		c.mu.Lock()
		err := st.err
		c.mu.Unlock()
		if errors.Is(err, manifest.ErrDiverged) {
			return err // no retry can land it
		}
		if err != nil {
			if failed++; failed == waitAttempts {
				return err
			}
		}
	}
}

// waitAttempts is how many failed attempts in a row a wait for a copy sits out.
const waitAttempts = 5

// pending returns the shards whose copy is due and the sequence each waits for.
func (c *copier) pending() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64)
	for shard, st := range c.mu.shards {
		if st.want.Seq > st.landed {
			out[shard] = st.want.Seq
		}
	}
	return out
}

// close stops the copier: copies in flight are cancelled, queued ones dropped.
func (c *copier) close() {
	c.mu.Lock()
	c.mu.closed = true
	for stop := range c.mu.timers {
		(*stop)()
	}
	clear(c.mu.timers)
	for _, st := range c.mu.shards {
		close(st.changed)
		st.changed = make(chan struct{})
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}
