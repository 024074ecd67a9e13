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

// openTail starts the engine's tail: a new incarnation of its stream on the tail
// replica, and the flusher that ships every page the WAL takes to it.
func (e *Engine) openTail() error {
	name := e.opts.Tail.Replica
	if name == "" {
		name = e.set.Authority().Name
	}
	spec, _ := e.set.Get(name)
	inc, err := nextIncarnation(e.opts.Dir)
	if err != nil {
		return err
	}
	var w [8]byte
	rand.Read(w[:])
	e.tail.replica, e.tail.incarnation = name, inc
	stream := tail.NewStream(spec.Bucket, e.opts.Instance, inc, 0, hex.EncodeToString(w[:]))
	e.tail.flusher = tail.NewFlusher(stream, tail.FlushOptions{Interval: e.opts.Tail.Interval, Bytes: e.opts.Tail.Bytes})
	e.log.ShipTo(e.tail.flusher, wal.ShipOptions{
		Remote:   e.opts.Durability == Remote,
		MaxBytes: e.opts.Tail.MaxUnshippedBytes, MaxAge: e.opts.Tail.MaxUnshippedAge,
	})
	return nil
}

// nextIncarnation returns the incarnation after the one kept in dir/incarnation,
// and keeps it there: every open of the engine ships its tail in a stream of its
// own, which no earlier process of the same instance can have written or fenced.
func nextIncarnation(dir string) (uint64, error) {
	path := filepath.Join(dir, "incarnation")
	var n uint64
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		n, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("engine: %s: %w", path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, fmt.Errorf("engine: %w", err)
	}
	n++
	if err := fsutil.WriteFileAtomic(path, []byte(strconv.FormatUint(n, 10)+"\n")); err != nil {
		return 0, fmt.Errorf("engine: %w", err)
	}
	return n, nil
}

// tailPointer is the tail pointer of a shard whose pages this engine ships from
// now on: its stream, from the next object on.
func (e *Engine) tailPointer() *manifest.Tail {
	return &manifest.Tail{Replica: e.tail.replica, Instance: e.opts.Instance, Incarnation: e.tail.incarnation, From: e.tail.flusher.Next()}
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
	if !prev.Released || until == 0 {
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

// shipBacklog gives the tail the shard's pages from sealed on, under the owner
// epoch about to be taken, and waits until they are shipped: the stream the
// takeover points the manifest at must hold everything past the sealed watermark.
func (e *Engine) shipBacklog(ctx context.Context, id string, epoch, sealed uint64) error {
	var last *tail.Ticket
	for p, err := range e.log.Pages(id, sealed) {
		if err != nil {
			return err
		}
		last = e.tail.flusher.Add(id, epoch, p.FirstOffset, p.Records)
	}
	if last == nil {
		return nil
	}
	if err := last.Wait(ctx); err != nil {
		return fmt.Errorf("engine: shard %q: ship the backlog: %w", id, err)
	}
	return nil
}
