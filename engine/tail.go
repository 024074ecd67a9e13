package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/lease"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/wal"
)

// ErrTailMissing reports a shard whose manifest points at tail records that are
// not there: a section missing from the stream, or a stream on a replica this
// engine does not have. The open refuses rather than hand out offsets another
// owner may have acknowledged.
var ErrTailMissing = errors.New("engine: tail records missing")

// openTail starts the engine's tail on the tail replica: every page the WAL
// takes is shipped there, in incarnation after incarnation (see tail.Tail).
func (e *Engine) openTail() {
	e.tailReplica = e.opts.Tail.Replica
	if e.tailReplica == "" {
		e.tailReplica = e.set.Authority().Name
	}
	spec, _ := e.set.Get(e.tailReplica)
	e.tail = tail.Open(tail.Options{
		Bucket: spec.Bucket, Instance: e.opts.Instance,
		NextIncarnation: func(after uint64) (uint64, error) { return nextIncarnation(e.opts.FS, e.opts.Dir, after) },
		Flush: tail.FlushOptions{
			Interval: e.opts.Tail.Interval, Bytes: e.opts.Tail.Bytes, Retry: e.opts.Tail.Retry,
			Clock: e.opts.Clock, Shipped: e.events.TailShipped,
		},
		Taken: e.shardTaken,
		Collect: tail.CollectOptions{
			Every: e.opts.Tail.CollectEvery, After: e.opts.Tail.CollectAfter,
			View: e.tailView, Collected: func(n int) { e.metrics.collected.Add(float64(n)) },
			Dead: e.deadInstances,
		},
		Logger: e.opts.Logger,
	})
	e.log.ShipTo(walSink{e.tail, e.opts.Tail.MaxUnshippedBytes, e.opts.Tail.MaxUnshippedAge},
		wal.ShipOptions{Remote: e.opts.Durability == Remote})
}

// tailView is what collection needs of a shard's manifest: the owner's view
// while it holds the lease, unless a write of its may have landed unseen, or
// else the authority's.
func (e *Engine) tailView(ctx context.Context, id string) (tail.View, error) {
	e.mu.Lock()
	o := e.mu.owners[id]
	e.mu.Unlock()
	var m manifest.Manifest
	if o != nil && o.Valid() == nil && o.Settled() {
		m = o.Manifest()
	} else {
		var err error
		if m, _, err = e.store.Load(ctx, id); err != nil {
			return tail.View{}, err
		}
	}
	v := tail.View{Epoch: m.Epoch, Sealed: m.Sealed}
	if t := m.Tail; t != nil && t.Replica == e.tailReplica {
		v.Pointer = pointerOf(t)
	}
	return v, nil
}

// pointerOf is the tail's reading of a manifest's tail pointer.
func pointerOf(t *manifest.Tail) *tail.Pointer {
	p := &tail.Pointer{Instance: t.Instance, From: tail.Position{Incarnation: t.Incarnation, Sequence: t.From}}
	if t.Until != 0 {
		p.Until = tail.Position{Incarnation: t.Incarnation, Sequence: t.Until}
		if t.UntilIncarnation != 0 {
			p.Until.Incarnation = t.UntilIncarnation
		}
	}
	return p
}

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

// shardTaken fences the owner here of a shard that a takeover elsewhere marked
// taken at epoch in this instance's chain: its pages under that epoch are no
// longer shipped, so nothing more of it may be acknowledged.
func (e *Engine) shardTaken(id string, epoch uint64) {
	e.mu.Lock()
	o := e.mu.owners[id]
	e.mu.Unlock()
	if o != nil && o.Epoch() == epoch {
		o.Fence("a takeover marked it in this instance's tail chain")
		e.opts.Logger.Warn("engine: a shard was taken over by another instance", "shard", id, "epoch", epoch)
	}
}

// walSink hands the WAL's pages to the tail.
type walSink struct {
	t        *tail.Tail
	maxBytes int
	maxAge   time.Duration
}

func (s walSink) Take(shard string, epoch, first uint64, recs [][]byte) wal.Shipment {
	return s.t.Add(shard, epoch, first, recs)
}

func (s walSink) Room(ctx context.Context) error { return s.t.WaitRoom(ctx, s.maxBytes, s.maxAge) }

func (s walSink) Gather() func() { return s.t.Gather() }

// shardTail tells a shard where its pages are in the tail.
type shardTail struct{ t *tail.Tail }

func (s shardTail) From(shard string, offset uint64) (uint64, uint64, bool) {
	at, ok := s.t.From(shard, offset)
	return at.Incarnation, at.Sequence, ok
}

func (s shardTail) Sealed(shard string, floor uint64) { s.t.Forget(shard, floor) }

func (s shardTail) Until(ctx context.Context, shard string) (uint64, uint64, bool, error) {
	at, ok, err := s.t.Until(ctx, shard)
	return at.Incarnation, at.Sequence, ok, err
}

// nextIncarnation returns the incarnation after the one kept in dir/incarnation
// and after listed, and keeps it there: every open of the engine ships its tail in
// a stream of its own, which no earlier process of the same instance can have
// written or fenced.
func nextIncarnation(fsys vfs.FS, dir string, listed uint64) (uint64, error) {
	path := filepath.Join(dir, "incarnation")
	var n uint64
	b, err := fsutil.ReadFile(fsys, path)
	switch {
	case err == nil:
		n, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("engine: %s: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, fmt.Errorf("engine: %w", err)
	}
	n = max(n, listed) + 1
	if err := fsutil.WriteFileAtomic(fsys, path, []byte(strconv.FormatUint(n, 10)+"\n")); err != nil {
		return 0, fmt.Errorf("engine: %w", err)
	}
	return n, nil
}

// tailPointer is the pointer of a shard whose pages this engine ships from at on.
func (e *Engine) tailPointer(at tail.Position) *manifest.Tail {
	return &manifest.Tail{Replica: e.tailReplica, Instance: e.opts.Instance, Incarnation: at.Incarnation, From: at.Sequence}
}

// readTail reads the records past the sealed watermark that the previous owner of
// a shard shipped, as prev points at them (see tail.ReadHistory): up to the end
// its release recorded, or else through the instance's chain, marking the shard
// taken and fencing the live incarnation first. It returns the records from
// prev.Sealed on, and whether it had to fence.
func (e *Engine) readTail(ctx context.Context, prev manifest.Manifest) (recs [][]byte, fenced bool, err error) {
	t := prev.Tail
	if t == nil {
		return nil, false, nil
	}
	spec, ok := e.set.Get(t.Replica)
	if !ok {
		return nil, false, fmt.Errorf("%w: shard %q: its tail is on replica %q, which this engine does not have", ErrTailMissing, prev.Shard, t.Replica)
	}
	p := *pointerOf(t)
	released := prev.Released && t.Until != 0
	if !released {
		p.Until = tail.Position{} // an end recorded by an owner that did not release is not one
	}
	opts := tail.HistoryOptions{Take: !released}
	if t.Instance == e.opts.Instance {
		// This instance's own tail, written by an earlier process (fenced and
		// ended as this one's tail started) or by this one, which holds nothing of
		// the shard under that epoch: read what the chain ended, mark nothing.
		opts = tail.HistoryOptions{Below: e.tail.Incarnation()}
	}
	h, err := tail.ReadHistory(ctx, spec.Bucket, p, prev.Shard, prev.Epoch, prev.Sealed, opts)
	if errors.Is(err, tail.ErrMissing) {
		return nil, false, fmt.Errorf("%w: %w", ErrTailMissing, err)
	}
	if err != nil {
		return nil, false, fmt.Errorf("engine: shard %q: read the tail: %w", prev.Shard, err)
	}
	if h.Fenced {
		e.metrics.fenceWritten(h.Wrote)
	}
	return h.Records, h.Fenced, nil
}

// shipBacklog gives the tail the shard's pages from sealed on, under epoch, and
// waits until they are shipped: the tail a manifest points at must hold
// everything past the sealed watermark.
func (e *Engine) shipBacklog(ctx context.Context, id string, epoch, sealed uint64) error {
	last, err := e.log.Reship(id, epoch, sealed)
	if err != nil || last == nil {
		return err
	}
	if err := last.Wait(ctx); err != nil {
		return fmt.Errorf("engine: shard %q: ship the backlog: %w", id, err)
	}
	return nil
}
