package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"time"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/partread"
	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/internal/shardlink"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// ReaderOptions configure a Reader. The zero value of every field but the
// replicas is valid and means the default that the field documents.
type ReaderOptions struct {
	// Replicas are where the shards' parts, manifests and tails are, named as the
	// engines that write them name them: a shard whose tail pointer names a
	// replica the reader does not have cannot be read past its sealed parts.
	// Required, unless Bucket is set. The Reader does not close the buckets.
	Replicas []replica.Spec
	// Authority names the replica whose manifests are read. Default: the first.
	Authority string
	// Bucket is shorthand for a single replica named after the bucket.
	Bucket *substrate.Bucket
	// Poll is how long a following read waits at the end of a shard before it
	// reads the shard again. Default 50 ms, the tail's flush interval.
	Poll time.Duration
	// Clock times the waits of following reads. Default: the real clock.
	Clock clock.Clock
	// Logger receives the reader's messages; nil discards them.
	Logger *slog.Logger
}

// defaultPoll is ReaderOptions.Poll's default: the tail's default flush
// interval, so that a follower reads about once per object an owner puts.
const defaultPoll = 50 * time.Millisecond

// Reader reads shards from the object store without owning them: any process may
// open one, beside the engines that write the shards or elsewhere. It reads a
// shard's sealed parts and the records its owner shipped to its remote tail, and
// returns only records that the shard's history keeps, whoever owns it next. It
// is safe for concurrent use.
//
// It lags the owner: a record is there once its page is in a tail object, which
// in Remote mode is before its append returns, and in Local mode within the
// tail's flush interval after; a following read sees it within Poll after that.
// Each pass costs object-store requests (see Read).
type Reader struct {
	opts   ReaderOptions
	set    *replication.Set
	closed chan struct{}
	once   sync.Once
}

// OpenReader opens a Reader. It makes no request.
func OpenReader(ctx context.Context, opts ReaderOptions) (*Reader, error) {
	if len(opts.Replicas) == 0 && opts.Bucket != nil {
		opts.Replicas = []replica.Spec{{Name: opts.Bucket.Name(), Domain: "default", Bucket: opts.Bucket}}
	}
	switch {
	case len(opts.Replicas) == 0:
		return nil, fmt.Errorf("%w: reader: Replicas (or Bucket) is required", ErrInvalidOptions)
	case opts.Bucket != nil && (len(opts.Replicas) != 1 || opts.Replicas[0].Bucket != opts.Bucket):
		return nil, fmt.Errorf("%w: reader: set Replicas or Bucket, not both", ErrInvalidOptions)
	case opts.Poll < 0:
		return nil, fmt.Errorf("%w: reader: Poll %s", ErrInvalidOptions, opts.Poll)
	}
	set, err := replication.NewSet(opts.Replicas, opts.Authority)
	if err != nil {
		return nil, fmt.Errorf("%w: reader: %w", ErrInvalidOptions, err)
	}
	if opts.Poll == 0 {
		opts.Poll = defaultPoll
	}
	opts.Clock = clock.OrReal(opts.Clock)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reader{opts: opts, set: set, closed: make(chan struct{})}, nil
}

// Close ends the Reader's following reads (with ErrClosed, at their next wait).
func (r *Reader) Close() error {
	r.once.Do(func() { close(r.closed) })
	return nil
}

// Read iterates over shard id's records from offset from, in offset order, each
// once: the sealed parts its manifest names, then the records its owner shipped
// to its tail past them. The options are Shard.Read's: Until and Limit bound the
// read, and Follow makes it read the shard again every Poll once it reached the
// end, following it across seals and moves to other owners, until its context
// ends or the Reader closes. Values are the caller's to keep. A shard never
// written yields nothing.
//
// A record read from the tail may be one whose append has not returned yet, or
// returned ErrOutcomeUnknown (its page was shipped, and every later owner keeps
// it); never one whose append failed. An error ends the read, naming what could
// not be read; the read never skips a record. Records a Reader returned and a
// later owner's history holds with other bytes end it with an error too, which
// would be a bug of the engine's.
//
// A full pass makes these requests: one GET of the manifest on the authority;
// for each part it reads, a few ranged GETs; and with a tail pointer, one GET of
// the owner's chain (none when its release recorded an end in one incarnation),
// one LIST of each incarnation it reads, and two ranged GETs of each object
// listed (its index, and the shard's section if it has one). A follower whose
// pass ended in the owner's live tail reads on from there for a second after
// each manifest read: one request a poll while nothing is new, two more for each
// object put since. An idle follower so costs about one request a Poll and one
// a second.
func (r *Reader) Read(ctx context.Context, id string, from uint64, opts ...shard.ReadOption) iter.Seq2[shard.Record, error] {
	o := shardlink.ReadOptionsOf(opts)
	return func(yield func(shard.Record, error) bool) {
		fail := func(err error) {
			yield(shard.Record{}, fmt.Errorf("engine: reader: shard %q: read from %d: %w", id, from, err))
		}
		if err := shard.ValidateID(id); err != nil {
			fail(err)
			return
		}
		c := &cursor{next: from}
		n := 0
		done := func() bool { return (o.Bounded && c.next >= o.Until) || (o.Limit > 0 && n >= o.Limit) }
		if done() {
			return
		}
		bounded := func(rec shard.Record) bool {
			n++
			return yield(rec, nil) && !done()
		}
		for {
			select {
			case <-r.closed:
				fail(ErrClosed)
				return
			default:
			}
			more, err := r.pass(ctx, id, c, bounded)
			if err != nil {
				fail(err)
				return
			}
			if !more || done() || !o.Follow {
				return
			}
			select {
			case <-r.opts.Clock.After(r.opts.Poll):
			case <-ctx.Done():
				fail(fmt.Errorf("following at %d: %w", c.next, ctx.Err()))
				return
			case <-r.closed:
				fail(fmt.Errorf("following at %d: %w", c.next, ErrClosed))
				return
			}
		}
	}
}

// cursor is where a read is: the next offset to return, and the last record
// returned, kept as a hash to check against the history of a later owner.
type cursor struct {
	next uint64
	// last is the hash of the record at next-1, if the read returned it.
	last    [sha256.Size]byte
	hasLast bool
	// owner is the epoch and tail instance of the manifest whose history the
	// last record was read or checked in; a pass under another reads that record
	// again and checks it.
	owner ownerKey
	// live is where the last pass left the owner's live tail incarnation, for
	// the next to read on from there without reading the tail again.
	live liveTail
}

// liveTail is where a pass left a live tail incarnation: when it read the
// manifest, the manifest's epoch and stream, and the sequence after the last
// object read. ok is false after a pass that did not end in a live incarnation.
type liveTail struct {
	ok       bool
	read     time.Time
	epoch    uint64
	replica  string
	instance string
	pos      tail.Position
}

type ownerKey struct {
	epoch    uint64
	instance string
}

func keyOf(m manifest.Manifest) ownerKey {
	k := ownerKey{epoch: m.Epoch}
	if m.Tail != nil {
		k.instance = m.Tail.Instance
	}
	return k
}

// pass reads the shard once, from its manifest, and yields what it holds past
// c.next; more is false when the caller stopped. A part or tail object missing
// where the manifest points (a seal committed, and its tail objects collected,
// between the manifest's read and theirs) makes it read the manifest again and
// start over from where it is; only a miss under the same manifest version twice
// is an error.
func (r *Reader) pass(ctx context.Context, id string, c *cursor, yield func(shard.Record) bool) (more bool, err error) {
	if c.live.ok && r.opts.Clock.Now().Sub(c.live.read) < manifestEvery {
		if more, done, err := r.readOn(ctx, id, c, yield); done {
			return more, err
		}
	}
	var missedAt substrate.Version
	missed := false
	for {
		read := r.opts.Clock.Now()
		m, ver, _, err := manifest.Read(ctx, r.set.Authority().Bucket, id)
		if err != nil {
			return false, err
		}
		c.live = liveTail{read: read}
		more, err := r.passOnce(ctx, id, m, c, yield)
		if err == nil || !isMiss(err) || (missed && ver == missedAt) || ctx.Err() != nil {
			return more, err
		}
		r.opts.Logger.Debug("engine: reader: an object the manifest pointed at is gone; reading the manifest again",
			"shard", id, "seq", m.Seq, "err", err)
		missed, missedAt = true, ver
	}
}

// isMiss reports an error of an object that was not there.
func isMiss(err error) bool {
	return errors.Is(err, tail.ErrMissing) || errors.Is(err, substrate.ErrNotFound)
}

// passOnce reads the shard as m describes it. When m's owner is not the one the
// last record returned was checked against (a takeover, a restart), it reads
// that record again from m's history and checks it: the history of every owner
// is byte for byte the one before it up to where the one before stopped.
func (r *Reader) passOnce(ctx context.Context, id string, m manifest.Manifest, c *cursor, yield func(shard.Record) bool) (more bool, err error) {
	key := keyOf(m)
	recheck := c.hasLast && c.owner != key
	pos := c.next
	if recheck {
		pos = c.next - 1
	}
	emit := func(off uint64, v []byte) bool {
		if off < c.next {
			if recheck && off == c.next-1 {
				if sha256.Sum256(v) != c.last {
					err = fmt.Errorf("offset %d, returned before, holds other bytes in the history of owner %q at epoch %d", off, m.Owner, m.Epoch)
					return false
				}
				c.owner, recheck = key, false
			}
			return true
		}
		c.next = off + 1
		c.last, c.hasLast = sha256.Sum256(v), true
		c.owner = key
		return yield(shard.Record{Offset: off, Value: bytes.Clone(v)})
	}
	for _, p := range m.Parts {
		if p.Next() <= pos {
			continue
		}
		more, perr := partread.Read(ctx, id, r.set.Specs(), p, &pos, shard.ErrNoReachableReplica, emit)
		if err != nil {
			return false, err
		}
		if perr != nil || !more {
			return false, perr
		}
	}
	if pos < m.Sealed {
		return false, fmt.Errorf("the manifest's parts end at %d, its sealed watermark is %d: %w", pos, m.Sealed, manifest.ErrCorrupt)
	}
	if m.Tail == nil {
		return true, nil
	}
	recs, h, err := r.readTail(ctx, m)
	if err != nil {
		return false, err
	}
	if h.Live {
		c.live.ok, c.live.epoch, c.live.replica, c.live.instance, c.live.pos = true, m.Epoch, m.Tail.Replica, m.Tail.Instance, h.End
	}
	for i, v := range recs {
		off := m.Sealed + uint64(i)
		if off < pos {
			continue
		}
		if !emit(off, v) {
			return false, err
		}
	}
	return true, nil
}

// readTail returns the records past the sealed watermark that m's owner shipped
// to its tail, read without a lease: it marks nothing and fences nothing. Read
// from a live incarnation, they end at its first gap or fence. Each is in an
// object below any fence a later owner puts (the writer's objects are a prefix of
// the sequences), in a section of m's epoch, contiguous from the sealed
// watermark, so every later owner keeps it at its offset: a takeover elsewhere
// reads every object below its fence, and a restart on the owner's Dir reads its
// own tail and keeps what its WAL lacks (or refuses, without the tail's replica).
func (r *Reader) readTail(ctx context.Context, m manifest.Manifest) ([][]byte, tail.History, error) {
	spec, ok := r.set.Get(m.Tail.Replica)
	if !ok {
		return nil, tail.History{}, fmt.Errorf("%w: its tail is on replica %q, which the reader does not have", ErrTailMissing, m.Tail.Replica)
	}
	p := tail.PointerOf(m.Tail)
	if !m.Released || m.Tail.Until == 0 {
		p.Until = tail.Position{} // an end recorded by an owner that did not release is not one
	}
	h, err := tail.ReadHistory(ctx, spec.Bucket, p, m.Shard, m.Epoch, m.Sealed, tail.HistoryOptions{SkipGone: true})
	if err != nil {
		return nil, tail.History{}, fmt.Errorf("read the tail: %w", err)
	}
	return h.Records, h, nil
}

// manifestEvery is how long a follower reads on in a live tail incarnation
// without reading the manifest again: how late it sees a seal (whose records it
// has read from the tail already, unless the owner's collection deleted their
// objects first) and a move after a release (which puts no fence in the old
// stream). A fence it meets in the stream, a takeover's or a reincarnation's,
// makes it read the manifest at once.
const manifestEvery = time.Second

// readOn reads on in the live incarnation where the last pass left it, while
// its manifest is recent: the records of the owner's epoch in the objects put
// there since, found one by one (tail.ReadNext), continuing from c.next. Each is
// where a full pass would read it, in a data object of that incarnation below
// any fence, so the same owners keep it. done is false when a full pass must
// read instead: a fence there (the incarnation ended), an object gone, or records
// that do not continue where the read is.
func (r *Reader) readOn(ctx context.Context, id string, c *cursor, yield func(shard.Record) bool) (more, done bool, err error) {
	l := &c.live
	spec, ok := r.set.Get(l.replica)
	if !ok {
		l.ok = false
		return false, false, nil
	}
	secs, next, fenced, err := tail.ReadNext(ctx, spec.Bucket, l.instance, l.pos.Incarnation, l.pos.Sequence, id)
	if err != nil {
		l.ok = false
		if isMiss(err) {
			return false, false, nil
		}
		return false, true, err
	}
	for _, sec := range secs {
		end := sec.First + uint64(len(sec.Records))
		switch {
		case sec.Epoch != l.epoch || end <= c.next:
			continue
		case sec.First > c.next:
			l.ok = false // a gap: read it all again
			return false, false, nil
		}
		start := c.next
		for i, v := range sec.Records[start-sec.First:] {
			off := start + uint64(i)
			c.next = off + 1
			c.last, c.hasLast = sha256.Sum256(v), true
			if !yield(shard.Record{Offset: off, Value: bytes.Clone(v)}) {
				l.pos.Sequence = sec.Sequence // what is left of it, next time
				return false, true, nil
			}
		}
	}
	l.pos.Sequence = next
	if fenced {
		l.ok = false
		return false, false, nil
	}
	return true, true, nil
}
