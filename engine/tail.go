package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/wal"
)

// ErrTailMissing reports a shard whose manifest points at tail records that are
// not there: a section missing from the stream, or a stream on a replica this
// engine does not have. The open refuses rather than hand out offsets another
// owner may have acknowledged.
var ErrTailMissing = errors.New("engine: tail records missing")

// tailStream is one incarnation of the engine's tail stream and its flusher.
type tailStream struct {
	flusher     *tail.Flusher
	incarnation uint64
}

// openTail starts the engine's tail: a new incarnation of its stream on the tail
// replica, and the flusher that ships every page the WAL takes to it. A fence met
// later starts another (see reincarnate).
func (e *Engine) openTail() error {
	e.tail.replica = e.opts.Tail.Replica
	if e.tail.replica == "" {
		e.tail.replica = e.set.Authority().Name
	}
	s, err := e.newTailStream()
	if err != nil {
		return err
	}
	e.tail.cur.Store(s)
	e.log.ShipTo(s.flusher, wal.ShipOptions{
		Remote:   e.opts.Durability == Remote,
		MaxBytes: e.opts.Tail.MaxUnshippedBytes, MaxAge: e.opts.Tail.MaxUnshippedAge,
	})
	return nil
}

// newTailStream starts the stream of the engine's next incarnation.
func (e *Engine) newTailStream() (*tailStream, error) {
	spec, _ := e.set.Get(e.tail.replica)
	// Past every incarnation on the replica too: a Dir restored from an older
	// copy, or another Dir given the same Instance, must not write into a stream
	// that exists. An engine opens without its object store (its WAL is local), so
	// a listing that fails leaves the Dir's count alone; a collision is then met
	// at the first put, as a fence, and the next incarnation lists again.
	ctx, cancel := context.WithTimeout(e.closing, min(e.opts.Lease.Duration, 5*time.Second))
	defer cancel()
	var listed uint64
	if streams, err := tail.Streams(ctx, spec.Bucket, e.opts.Instance); err != nil {
		e.opts.Logger.Warn("engine: the tail streams could not be listed; the incarnation is the Dir's", "err", err)
	} else if len(streams) > 0 {
		listed = streams[len(streams)-1].Incarnation
	}
	inc, err := nextIncarnation(e.opts.FS, e.opts.Dir, listed)
	if err != nil {
		return nil, err
	}
	var w [8]byte
	rand.Read(w[:])
	stream := tail.NewStream(spec.Bucket, e.opts.Instance, inc, 0, hex.EncodeToString(w[:]))
	return &tailStream{
		flusher: tail.NewFlusher(stream, tail.FlushOptions{
			Interval: e.opts.Tail.Interval, Bytes: e.opts.Tail.Bytes, Retry: e.opts.Tail.Retry,
			Clock: e.opts.Clock, Shipped: e.events.TailShipped,
		}),
		incarnation: inc,
	}, nil
}

// watchTail replaces the tail stream each time a takeover fences it, until the
// engine closes.
func (e *Engine) watchTail() {
	defer close(e.tail.done)
	for {
		s := e.tail.cur.Load()
		select {
		case <-e.stop:
			return
		case <-s.flusher.Done():
		}
		if !errors.Is(s.flusher.Err(), tail.ErrFenced) {
			return
		}
		if err := e.reincarnate(s); err != nil {
			e.opts.Logger.Error("engine: the tail was fenced and no new incarnation could start: appends fail", "err", err)
			return
		}
	}
}

// reincarnate carries on after a takeover fenced the tail stream old: nothing more
// is acknowledged from it. It starts the next incarnation's stream and moves every
// open shard to it (moveShard); the shard whose takeover fenced us fails to move,
// its manifest being another owner's, and fails its appends. (A shard whose lease
// merely lapsed moves too: a renewal may bring it back.) A shard opened meanwhile
// on the old stream moves itself as its open ends (see OpenShard).
func (e *Engine) reincarnate(old *tailStream) error {
	s, err := e.newTailStream()
	if err != nil {
		return err
	}
	e.tail.mu.Lock()
	e.tail.retired = addStats(e.tail.retired, old.flusher.Stats())
	e.tail.cur.Store(s)
	e.tail.mu.Unlock()
	e.log.ShipNewShardsTo(s.flusher)
	e.opts.Logger.Warn("engine: the tail was fenced by a takeover; carrying on in a new incarnation",
		"old", old.incarnation, "new", s.incarnation)
	owners, _ := e.owners()
	e.tail.mu.Lock()
	for id := range owners {
		e.waitFor(id)
	}
	e.tail.mu.Unlock()
	ctx, cancel := context.WithTimeout(e.closing, e.opts.Lease.Duration)
	defer cancel()
	for id, o := range owners {
		e.moveShard(ctx, id, o, s) // one that fails fails its appends, and says so
	}
	return nil
}

// moveShard moves shard id, which o owns, to the tail stream s: it ships the
// shard's records past the sealed watermark there and points the manifest at it,
// holding the shard's acknowledgements meanwhile. If it fails, the shard's
// appends fail from then on (its acknowledged records are all in the stream it
// was on, which the manifest still names) until it is closed and opened again.
func (e *Engine) moveShard(ctx context.Context, id string, o *manifest.Owner, s *tailStream) error {
	e.tail.mu.Lock()
	e.waitFor(id)
	e.tail.mu.Unlock()
	ptr := e.tailPointer(s)
	err := e.shipBacklog(ctx, s, id, o.Epoch(), o.Sealed(), true)
	if err == nil {
		err = o.PointTail(ctx, *ptr)
	}
	if err == nil || errors.Is(err, manifest.ErrFenced) || errors.Is(err, manifest.ErrOwned) {
		// Moved; or another owner's now, its pages here superseded.
		e.tail.mu.Lock()
		delete(e.tail.waiting, id)
		e.tail.mu.Unlock()
	}
	if err != nil {
		err = fmt.Errorf("engine: shard %q: move to tail incarnation %d: %w", id, s.incarnation, err)
		e.opts.Logger.Error("engine: a shard could not move to the new tail incarnation: its appends fail", "shard", id, "err", err)
	}
	e.log.Resume(id, err)
	return err
}

// waitFor records that shard id's pages wait for a move to the current stream,
// e.tail.mu held.
func (e *Engine) waitFor(id string) {
	if e.tail.waiting == nil {
		e.tail.waiting = map[string]bool{}
	}
	e.tail.waiting[id] = true
}

// tailStats are the counters of every stream this engine shipped. What is not
// shipped (Pending, Oldest) is the current stream's, and every page of a shard
// that waits for a move to it: until its manifest points there, a page of it
// that the fenced stream missed is on this Dir alone, even once put in the new
// stream. (The pages the fenced stream holds count too: an upper bound while a
// move waits, as the WAL does not know which shard's pages an object held.) A
// shard with no pages left waits no longer.
func (e *Engine) tailStats() tail.FlushStats {
	e.tail.mu.Lock()
	defer e.tail.mu.Unlock()
	cur := e.tail.cur.Load().flusher.Stats()
	sum := addStats(e.tail.retired, cur)
	sum.Pending, sum.Oldest = cur.Pending, cur.Oldest
	for id := range e.tail.waiting {
		info := e.log.Info(id)
		if info.Pages == 0 {
			delete(e.tail.waiting, id)
			continue
		}
		sum.Pending += int(info.UnsealedBytes)
		if sum.Oldest.IsZero() || info.Oldest.Before(sum.Oldest) {
			sum.Oldest = info.Oldest
		}
	}
	return sum
}

func addStats(a, b tail.FlushStats) tail.FlushStats {
	a.Puts += b.Puts
	a.Bytes += b.Bytes
	a.Failures += b.Failures
	return a
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

// tailPointer is the tail pointer of a shard whose pages this engine ships from
// now on: its stream, from the next object on.
func (e *Engine) tailPointer(s *tailStream) *manifest.Tail {
	return &manifest.Tail{Replica: e.tail.replica, Instance: e.opts.Instance, Incarnation: s.incarnation, From: s.flusher.Next()}
}

// readTail reads the records past the sealed watermark that the previous owner of
// a shard shipped, as prev points at them: up to the end its release recorded, or
// else up to a fence, which it puts first (see tail.Fence). It returns where the
// records start (prev.Sealed) and the records, and whether it had to fence.
func (e *Engine) readTail(ctx context.Context, prev manifest.Manifest) (recs [][]byte, fenced bool, err error) {
	t := prev.Tail
	if t == nil {
		return nil, false, nil
	}
	spec, ok := e.set.Get(t.Replica)
	if !ok {
		return nil, false, fmt.Errorf("%w: shard %q: its tail is on replica %q, which this engine does not have", ErrTailMissing, prev.Shard, t.Replica)
	}
	until := t.Until
	if (!prev.Released || until == 0) && !broken.Is(broken.SkipFence) {
		seq, met, err := tail.Fence(ctx, spec.Bucket, t.Instance, t.Incarnation, t.From)
		if err != nil {
			return nil, false, fmt.Errorf("engine: shard %q: fence the tail of %s/%d: %w", prev.Shard, t.Instance, t.Incarnation, err)
		}
		e.metrics.fenceWritten(!met)
		until, fenced = seq, true
	}
	sections, err := tail.ReadShard(ctx, spec.Bucket, t.Instance, t.Incarnation, t.From, until, prev.Shard)
	if err != nil {
		return nil, false, fmt.Errorf("engine: shard %q: read the tail: %w", prev.Shard, err)
	}
	next := prev.Sealed
	for _, s := range sections {
		end := s.First + uint64(len(s.Records))
		switch {
		case s.Epoch != prev.Epoch || end <= next:
			continue // another ownership's pages (a takeover that lost its race), or sealed
		case s.First > next:
			return nil, false, fmt.Errorf("%w: shard %q: the tail of %s/%d holds offsets from %d, the records from %d are not there",
				ErrTailMissing, prev.Shard, t.Instance, t.Incarnation, s.First, next)
		}
		recs = append(recs, s.Records[next-s.First:]...)
		next = end
	}
	return recs, fenced, nil
}

// shipBacklog gives the tail stream s the shard's pages from sealed on, under
// epoch, and waits until they are shipped: the stream a manifest is pointed at
// must hold everything past the sealed watermark. With hold, the shard's new
// appends are not acknowledged until the caller resumes it (see wal.Log.Reship).
func (e *Engine) shipBacklog(ctx context.Context, s *tailStream, id string, epoch, sealed uint64, hold bool) error {
	last, err := e.log.Reship(id, epoch, sealed, s.flusher, hold)
	if err != nil {
		return err
	}
	if last == nil {
		return nil
	}
	if err := last.Wait(ctx); err != nil {
		return fmt.Errorf("engine: shard %q: ship the backlog: %w", id, err)
	}
	return nil
}
