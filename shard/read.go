package shard

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/l0store/l0/internal/partread"
	"github.com/l0store/l0/internal/shardlink"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/wal"
)

// Record is one record and its offset.
type Record struct {
	Offset uint64
	Value  []byte
}

// A ReadOption bounds a Read, or makes it follow the shard.
type ReadOption func(*readOptions)

type readOptions struct {
	follow  bool
	bounded bool // by until
	until   uint64
	limit   int // 0: no bound
}

func init() {
	shardlink.ReadOptionsOf = func(v any) shardlink.ReadOptions {
		var o readOptions
		for _, opt := range v.([]ReadOption) {
			opt(&o)
		}
		return shardlink.ReadOptions{Follow: o.follow, Bounded: o.bounded, Until: o.until, Limit: o.limit}
	}
}

// Follow makes a Read wait at the end of the shard's records for the next ones,
// and yield each as soon as its append is acknowledged, until the read's
// context ends (the read then ends with the context's error), the handle closes
// (ErrClosed) or another instance may own the shard (ErrFenced: the handle was
// fenced, or its lease ran out unrenewed). A lease that lapses and is renewed
// before it runs out does not end it: no record is acknowledged meanwhile.
func Follow() ReadOption { return func(o *readOptions) { o.follow = true } }

// Until ends a Read before offset end: it yields the records below end, and with
// Follow waits for them.
func Until(end uint64) ReadOption { return func(o *readOptions) { o.bounded, o.until = true, end } }

// Limit ends a Read after n records (n > 0).
func Limit(n int) ReadOption { return func(o *readOptions) { o.limit = n } }

// followRecheck is how often a following read that waits checks that its
// handle is still the shard's owner: a takeover elsewhere wakes nothing here. It
// is real time, whatever the engine's clock: a bound on how late a fenced
// handle's follower learns it, not a duration of the protocol.
const followRecheck = time.Second

// Read iterates over the shard's records from offset from, in offset order: the
// sealed parts the manifest names, then the pages still in the WAL, with seamless
// offsets. It returns acknowledged records only (Info's Readable is where it
// ends now); options bound it (Until, Limit) or make it wait for more (Follow).
// Values are the caller's to keep. A from past the last record yields nothing.
// A part that cannot be read, or fails its checks, ends the iteration with an
// error naming it: never a shorter history without one. Only the owner knows the
// history's end, so a read through a handle whose lease has lapsed, before it
// starts or by the time it reaches the end, ends with ErrFenced: another owner may
// have appended since.
func (s *Shard) Read(ctx context.Context, from uint64, opts ...ReadOption) iter.Seq2[Record, error] {
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	return func(yield func(Record, error) bool) {
		s.mu.RLock()
		closed := s.mu.closed
		s.mu.RUnlock()
		if closed {
			yield(Record{}, fmt.Errorf("shard %q: read: %w", s.id, ErrClosed))
			return
		}
		next, n := from, 0
		fail := func(err error) { yield(Record{}, fmt.Errorf("shard %q: read from %d: %w", s.id, from, err)) }
		if err := s.cfg.Owner.Valid(); err != nil {
			fail(err)
			return
		}
		done := func() bool { return (o.bounded && next >= o.until) || (o.limit > 0 && n >= o.limit) }
		if done() {
			return
		}
		bounded := func(r Record, err error) bool {
			if err == nil {
				n++
			}
			return yield(r, err) && !done()
		}
		for {
			// The watch is taken before the read, so that an append acknowledged
			// while it reads wakes the wait after it.
			acked, changed := s.watch()
			more, err := s.readOnce(ctx, &next, acked, bounded)
			if err != nil {
				fail(err)
				return
			}
			if !more || done() {
				return
			}
			if !o.follow {
				if err := s.cfg.Owner.Valid(); err != nil {
					fail(fmt.Errorf("the end at %d may not be the history's: %w", next, err))
				}
				return
			}
			if err := s.waitFor(ctx, changed); err != nil {
				fail(fmt.Errorf("following at %d: %w", next, err))
				return
			}
		}
	}
}

// waitFor waits until changed is closed, and returns the reason a following
// read must end instead: its context ended, the handle closed, or its ownership
// ended for good.
func (s *Shard) waitFor(ctx context.Context, changed <-chan struct{}) error {
	recheck := time.NewTicker(followRecheck)
	defer recheck.Stop()
	for {
		if s.cfg.Owner.Superseded() {
			if err := s.cfg.Owner.Valid(); err != nil {
				return err
			}
			return manifest.ErrFenced
		}
		select {
		case <-changed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopped:
			return ErrClosed
		case <-recheck.C:
		}
	}
}

// readOnce yields the records from *next to the end of the acknowledged ones,
// advancing *next; more is false when the caller stopped. A seal may commit and
// truncate the WAL between reading the manifest and reading the pages; then the
// pages are in a part of the newer manifest (a seal publishes before it
// truncates), and the read goes on there. It retries only while the manifest
// moves, so it cannot loop.
func (s *Shard) readOnce(ctx context.Context, next *uint64, acked uint64, yield func(Record, error) bool) (more bool, err error) {
	for {
		m := s.cfg.Owner.Manifest()
		for _, p := range m.Parts {
			if p.Next() <= *next {
				continue
			}
			more, err := s.readPart(ctx, p, next, yield)
			if err != nil || !more {
				return false, err
			}
		}
		more, err := s.readPages(ctx, next, acked, yield)
		if errors.Is(err, wal.ErrTruncated) && s.cfg.Owner.Sealed() > m.Sealed {
			continue
		}
		return more, err
	}
}

// readPart yields the records of p from *next on, advancing *next; more is false
// when the caller stopped (see partread.Read).
func (s *Shard) readPart(ctx context.Context, p manifest.Part, next *uint64, yield func(Record, error) bool) (more bool, err error) {
	return partread.Read(ctx, s.id, s.cfg.Replicas.Specs(), p, next, ErrNoReachableReplica, func(off uint64, v []byte) bool {
		return yield(Record{Offset: off, Value: v}, nil)
	})
}

// readPages yields the WAL's records from *next up to acked; more is false when
// the caller stopped.
func (s *Shard) readPages(ctx context.Context, next *uint64, acked uint64, yield func(Record, error) bool) (more bool, err error) {
	for page, err := range s.cfg.Log.Pages(s.id, *next) {
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return false, err
		}
		if page.FirstOffset > *next {
			return false, fmt.Errorf("the WAL continues at %d where %d was due: %w", page.FirstOffset, *next, wal.ErrCorrupt)
		}
		for i, v := range page.Records {
			off := page.FirstOffset + uint64(i)
			if off < *next {
				continue
			}
			if off >= acked {
				return true, nil
			}
			*next = off + 1
			if !yield(Record{Offset: off, Value: v}, nil) {
				return false, nil
			}
		}
	}
	return true, nil
}
