package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	dto "github.com/prometheus/client_model/go"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/internal/tail"
)

// batchOverhead bounds what a pebble batch of one Set adds to its key and value: the
// batch header, the kind and two uvarint lengths.
const batchOverhead = 12 + 1 + 2*binary.MaxVarintLen32

// Options configure a Log.
type Options struct {
	// Logger receives pebble's messages; nil discards them.
	Logger *slog.Logger
	// MemTableSize is pebble's memtable size. Default 64 MiB: with pebble's 4 MiB
	// default, a steady stream of synced commits piles up L0 files and compaction
	// debt caps throughput.
	MemTableSize uint64
	// Clock is the clock stamped on pages and the watermark's pace. Default
	// clock.Real.
	Clock clock.Clock
	// AckedInterval is how often, at most, the acknowledged watermark is rewritten
	// while the log changes (see the l0-acked file in doc.go). Acknowledged records
	// whose loss inside pebble's last log file goes undetected are at most those of
	// the last interval before a crash. Default 100 ms.
	AckedInterval time.Duration
	// FS is the file system of the log: pebble's files and the l0-acked file
	// beside them. Pebble's disk-health checks wrap it. Default vfs.Default; a test
	// passes an in-memory one that forgets unsynced writes, or one that fails calls.
	FS vfs.FS
}

// EnsureDefaults fills in the zero fields.
func (o *Options) EnsureDefaults() {
	if o.MemTableSize == 0 {
		o.MemTableSize = 64 << 20
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.AckedInterval == 0 {
		o.AckedInterval = 100 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
}

// Log is the WAL of one engine. It is safe for concurrent use; appends to one shard
// are ordered, appends to different shards run in parallel and share fsyncs.
type Log struct {
	db       *pebble.DB
	fsCloser io.Closer // stops the disk-health checks of db's file system
	dir      string
	opts     Options

	// changes counts appends and truncations; the watermark goroutine rewrites the
	// l0-acked file when it moved since written, which only that goroutine (and Close
	// after it) touches.
	changes   atomic.Uint64
	marksMu   sync.Mutex // serializes writes of the l0-acked file
	written   uint64     // changes when last written; guarded by marksMu
	stopMarks chan struct{}
	marksDone chan struct{}

	mu struct {
		sync.RWMutex
		shards map[string]*shardState
	}
	// ops counts calls in flight; Close waits for them, because pebble must not be
	// closed under a commit or an iterator.
	ops struct {
		sync.Mutex
		cond     sync.Cond
		inflight int
		closed   bool
	}
	// failed is set when a commit was applied but its sync failed: from then on the
	// in-memory offsets may be ahead of the disk, so the Log refuses everything.
	failed atomic.Pointer[error]
	// tail is the flusher new shards ship their pages to (see ShipTo), and ship
	// how appends wait for it.
	tail atomic.Pointer[tail.Flusher]
	ship ShipOptions
}

// shardState is what the Log knows of one shard without reading its pages.
type shardState struct {
	// truncating is held by a truncation from start to end, and taken before mu.
	truncating sync.Mutex
	mu         struct {
		sync.Mutex
		floor   uint64 // first offset not truncated away
		next    uint64 // offset of the next record appended
		pages   int
		payload uint64    // record bytes in the shard's pages
		oldest  time.Time // appended-at of the first page; zero without pages
		epoch   uint64    // the owner epoch appends and truncations must carry
		// tail is the flusher the shard's pages go to, shipping the ticket of the
		// last page given to it. While gate is set, pages given to tail are not
		// acknowledged until it opens (see Reship). shipErr, once set, refuses
		// every append: the shard's pages can no longer be shipped.
		tail     *tail.Flusher
		shipping *tail.Ticket
		gate     *gate
		shipErr  error
		// given are the shard's pages given to tail since the floor, in offset
		// order (see TailFrom).
		given []givenPage
	}
	// acked is the end of the shard's records known durable: appends raise it after
	// their sync. floorMark is mu.floor once that is durable, for the watermark
	// writer, which must not take mu.
	acked     atomic.Uint64
	floorMark atomic.Uint64
}

func (st *shardState) setFloorLocked(floor uint64) {
	st.mu.floor = floor
	st.floorMark.Store(floor)
	st.forgetGivenLocked(floor)
}

// forgetGivenLocked drops the given pages below floor: sealed, so no TailFrom asks
// for them.
func (st *shardState) forgetGivenLocked(floor uint64) {
	i := 0
	for i < len(st.mu.given) && st.mu.given[i].first < floor {
		i++
	}
	st.mu.given = st.mu.given[i:]
}

// Open opens (creating it if needed) the log in dir and loads every shard's state.
func Open(dir string, opts Options) (*Log, error) {
	opts.EnsureDefaults()
	// Pebble starts a disk-health goroutine for its default file system and stops it
	// only in DB.Close, so a failed Open would leak it: l0 owns it instead.
	fs, fsCloser := vfs.WithDiskHealthChecks(opts.FS, 5*time.Second, nil, func(info vfs.DiskSlowInfo) {
		opts.Logger.Warn("wal: slow disk", "path", info.Path, "op", info.OpType.String(), "duration", info.Duration)
	})
	db, err := pebble.Open(dir, &pebble.Options{
		FS:                 fs,
		FormatMajorVersion: pebble.FormatNewest,
		MemTableSize:       opts.MemTableSize,
		Logger:             pebbleLogger{opts.Logger},
		// Pebble's default makes corruption found on a read fatal; l0 reports it as
		// the read's error instead, and logs it.
		EventListener: &pebble.EventListener{DataCorruption: func(info pebble.DataCorruptionInfo) {
			opts.Logger.Error("wal: on-disk corruption", "path", info.Path, "err", info.Details)
		}},
	})
	if err != nil {
		fsCloser.Close()
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	l := &Log{db: db, fsCloser: fsCloser, dir: dir, opts: opts}
	l.ops.cond.L = &l.ops.Mutex
	l.mu.shards = make(map[string]*shardState)
	if err := l.recover(); err != nil {
		db.Close()
		fsCloser.Close()
		return nil, err
	}
	l.stopMarks, l.marksDone = make(chan struct{}), make(chan struct{})
	go l.syncMarks(l.stopMarks, l.marksDone)
	return l, nil
}

// recover loads the shards' state and checks it against the acknowledged watermark.
func (l *Log) recover() error {
	marks, err := readMarks(l.opts.FS, l.dir)
	if err != nil {
		return err
	}
	if err := l.load(); err != nil {
		return err
	}
	if err := l.checkMarks(marks); err != nil {
		return err
	}
	for _, st := range l.mu.shards {
		st.acked.Store(st.mu.next)
	}
	// A kill before the watermark caught up leaves it behind the log. Claim what was
	// recovered now: nothing else would rewrite it before a change, and a clean Close
	// with none would leave the replayed records uncovered. Pebble's Open flushed what
	// it replayed to synced tables, so all of it is durable.
	if !maps.Equal(marks, l.marks()) {
		return l.writeMarksNow()
	}
	return nil
}

// load reads the floors and the page headers of every shard.
func (l *Log) load() error {
	it, err := l.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("wal: load: %w", err)
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		k := it.Key()
		switch k[0] {
		case floorPrefix:
			v := it.Value()
			if len(v) != 8 {
				return fmt.Errorf("wal: floor of shard %q: %d bytes: %w", k[1:], len(v), ErrCorrupt)
			}
			st := l.stateLocked(string(k[1:]))
			st.setFloorLocked(binary.BigEndian.Uint64(v))
			st.mu.next = max(st.mu.next, st.mu.floor)
		case epochPrefix:
			v := it.Value()
			if len(v) != 8 {
				return fmt.Errorf("wal: epoch of shard %q: %d bytes: %w", k[1:], len(v), ErrCorrupt)
			}
			l.stateLocked(string(k[1:])).mu.epoch = binary.BigEndian.Uint64(v)
		case pagePrefix:
			shard, first, ok := parsePageKey(k)
			if !ok {
				return fmt.Errorf("wal: page key %q: %w", k, ErrCorrupt)
			}
			h, err := decodeHeader(shard, first, it.Value())
			if err != nil {
				return err
			}
			st := l.stateLocked(shard)
			// Floor keys sort before page keys, so the floor is known here. Every
			// truncation and reset writes the floor in the batch that drops the pages
			// below it, and a shard without a floor key starts at 0: a first page
			// anywhere else means pages were lost.
			switch {
			case st.mu.pages == 0 && first < st.mu.floor:
				return &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("page before the floor %d", st.mu.floor)}
			case st.mu.pages == 0 && first > st.mu.floor:
				return &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("the first page, above the floor %d: a page is missing", st.mu.floor)}
			}
			if st.mu.pages > 0 && first != st.mu.next {
				return &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("page follows offset %d: a page is missing", st.mu.next)}
			}
			if st.mu.pages == 0 {
				st.mu.oldest = h.appendedAt
			}
			st.mu.pages++
			st.mu.payload += h.payload
			st.mu.next = first + uint64(h.count)
		default:
			return fmt.Errorf("wal: unknown key %q: %w", k, ErrCorrupt)
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("wal: load: %w", err)
	}
	return nil
}

// stateLocked returns the shard's state, creating it; l.mu must be held for writing
// (or the Log not yet shared).
func (l *Log) stateLocked(shard string) *shardState {
	st, ok := l.mu.shards[shard]
	if !ok {
		st = &shardState{}
		st.mu.tail = l.tail.Load()
		l.mu.shards[shard] = st
	}
	return st
}

func (l *Log) state(shard string) *shardState {
	l.mu.RLock()
	st, ok := l.mu.shards[shard]
	l.mu.RUnlock()
	if ok {
		return st
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stateLocked(shard)
}

// enter admits a call, which must call exit when done with pebble.
func (l *Log) enter() error {
	if errp := l.failed.Load(); errp != nil {
		return fmt.Errorf("%w: %v", ErrFailed, *errp) // not the earlier error's sentinels: this call wrote nothing
	}
	l.ops.Lock()
	defer l.ops.Unlock()
	if l.ops.closed {
		return ErrClosed
	}
	l.ops.inflight++
	return nil
}

func (l *Log) exit() {
	l.ops.Lock()
	defer l.ops.Unlock()
	l.ops.inflight--
	if l.ops.inflight == 0 {
		l.ops.cond.Broadcast()
	}
}

// Append writes recs as one page of shard and returns the offset of the first record
// once the page is durable. The caller validates shard ids and record sizes; an empty
// batch is refused, and so is an epoch other than the shard's (ErrStaleEpoch). A
// context cancelled before the commit writes nothing.
func (l *Log) Append(ctx context.Context, shard string, epoch uint64, recs [][]byte) (uint64, error) {
	if len(recs) == 0 {
		return 0, ErrEmptyBatch
	}
	if err := l.enter(); err != nil {
		return 0, err
	}
	defer l.exit()
	st := l.state(shard)
	if err := l.waitRoom(ctx, st); err != nil {
		return 0, err
	}
	key := pageKey(shard, 0)
	vlen := pageLen(recs)
	// The page is encoded straight into the batch: no copy of the records but the
	// one into pebble's batch.
	b := l.db.NewBatchWithSize(batchOverhead + len(key) + vlen)
	defer b.Close()

	// Under the shard's lock: take the offsets and enter pebble's commit pipeline, so
	// that pages of one shard reach pebble's WAL in offset order. The fsync is waited
	// for outside the lock, where appends of this and other shards share it.
	st.mu.Lock()
	if err := ctx.Err(); err != nil {
		st.mu.Unlock()
		return 0, err
	}
	if epoch != st.mu.epoch {
		st.mu.Unlock()
		return 0, fmt.Errorf("wal: shard %q: epoch %d, the shard's is %d: %w", shard, epoch, st.mu.epoch, ErrStaleEpoch)
	}
	if err := st.mu.shipErr; err != nil {
		st.mu.Unlock()
		return 0, fmt.Errorf("wal: shard %q: %w", shard, err)
	}
	first := st.mu.next
	if broken.Is(broken.ReuseOffset) && first > 0 && st.mu.pages%5 == 4 {
		first--
	}
	now := l.opts.Clock.Now()
	op := b.SetDeferred(len(key), vlen)
	binary.BigEndian.PutUint64(key[len(key)-8:], first)
	copy(op.Key, key)
	if v := encodePage(op.Value[:0], shard, first, now, recs); len(v) != vlen {
		panic(fmt.Sprintf("wal: page of %d bytes encoded to %d", vlen, len(v)))
	}
	if err := op.Finish(); err != nil {
		st.mu.Unlock()
		return 0, err
	}
	durably := pebble.Sync
	if broken.Is(broken.AckBeforeSync) {
		durably = pebble.NoSync
	}
	if err := l.applyNoSyncWait(b, durably); err != nil {
		// Pebble may have written the batch to its log before failing: the state
		// on disk is unknown, so the offsets in memory can no longer be trusted.
		st.mu.Unlock()
		err = fmt.Errorf("wal: commit: %w: %w", ErrUnknownOutcome, err)
		l.failed.CompareAndSwap(nil, &err)
		return 0, err
	}
	var (
		ship *tail.Ticket
		g    *gate
	)
	if f := st.mu.tail; f != nil {
		// Given under the lock, so that the tail gets the shard's pages in offset
		// order; shipped while the fsync runs.
		ship, g = f.Add(shard, epoch, first, recs), st.mu.gate
		st.mu.shipping = ship
		st.mu.given = append(st.mu.given, givenPage{first, ship})
	}
	if st.mu.pages == 0 {
		st.mu.oldest = now
	}
	st.mu.pages++
	st.mu.next = first + uint64(len(recs))
	for _, r := range recs {
		st.mu.payload += uint64(len(r))
	}
	st.mu.Unlock()

	if err := l.syncWait(b); err != nil {
		err = fmt.Errorf("wal: sync: %w: %w", ErrUnknownOutcome, err)
		l.failed.CompareAndSwap(nil, &err)
		return 0, err
	}
	if l.ship.Remote && ship != nil {
		// The page is durable here, and must be on the object store too, where
		// the shard's next owner looks, before it is acknowledged or read. A page
		// that fails to ship stays in the log, unacknowledged, like one whose
		// reply a crash lost.
		if err := ship.Wait(ctx); err != nil {
			return 0, fmt.Errorf("wal: ship: %w: %w", ErrUnknownOutcome, err)
		}
		if err := g.wait(ctx); err != nil {
			return 0, fmt.Errorf("wal: ship: %w: %w", ErrUnknownOutcome, err)
		}
	}
	// Appends of a shard sync in offset order, but may return out of it.
	for end := first + uint64(len(recs)); ; {
		acked := st.acked.Load()
		if acked >= end || st.acked.CompareAndSwap(acked, end) {
			break
		}
	}
	l.changes.Add(1)
	return first, nil
}

// ShardInfo is what the Log knows of a shard's unsealed pages.
type ShardInfo struct {
	// Floor is the first offset still in the log: everything before it was
	// truncated (sealed).
	Floor uint64
	// Next is the offset the next appended record gets.
	Next  uint64
	Pages int
	// UnsealedBytes is the sum of the record lengths in the shard's pages.
	UnsealedBytes uint64
	// Oldest is when the oldest page still in the log was appended; zero without
	// pages.
	Oldest time.Time
	// Epoch is the owner epoch last set with SetEpoch; 0 if never.
	Epoch uint64
}

// Info returns the shard's state; a shard never written has the zero ShardInfo.
func (l *Log) Info(shard string) ShardInfo {
	l.mu.RLock()
	st, ok := l.mu.shards[shard]
	l.mu.RUnlock()
	if !ok {
		return ShardInfo{}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return ShardInfo{Floor: st.mu.floor, Next: st.mu.next, Pages: st.mu.pages, UnsealedBytes: st.mu.payload, Oldest: st.mu.oldest, Epoch: st.mu.epoch}
}

// Shards returns the shards that have pages, sorted.
func (l *Log) Shards() []string {
	// Never hold l.mu while waiting for a shard's lock: Adopt holds a shard's lock
	// while the watermark writer reads l.mu.
	l.mu.RLock()
	states := maps.Clone(l.mu.shards)
	l.mu.RUnlock()
	var out []string
	for shard, st := range states {
		st.mu.Lock()
		if st.mu.pages > 0 {
			out = append(out, shard)
		}
		st.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// Pages iterates over the shard's pages from the one holding offset from, in offset
// order. Records alias nothing the Log reuses. A from before the shard's floor is
// ErrTruncated; a from at or past its next offset yields nothing.
//
// Only durable pages are yielded: the iteration ends, as if the log ended there, at
// the end of the records whose append had synced when it began. A page an append is
// still syncing (its offsets already in Info's Next) is not read; it may yet fail,
// or vanish in a crash and its offsets go to another record.
func (l *Log) Pages(shard string, from uint64) iter.Seq2[Page, error] {
	return l.pages(shard, from, true)
}

// PagesAliased is Pages without copying: a page's records are valid only until the
// iteration moves on. For readers that copy what they keep, such as a seal.
func (l *Log) PagesAliased(shard string, from uint64) iter.Seq2[Page, error] {
	return l.pages(shard, from, false)
}

func (l *Log) pages(shard string, from uint64, clone bool) iter.Seq2[Page, error] {
	return func(yield func(Page, error) bool) {
		if err := l.enter(); err != nil {
			yield(Page{}, err)
			return
		}
		defer l.exit()
		it, end, err := l.view(shard, from)
		if err != nil {
			yield(Page{}, err)
			return
		}
		if it == nil {
			return
		}
		defer it.Close()
		scan(it, shard, from, end, clone, yield)
	}
}

// view checks from against the shard's floor and opens an iterator over its pages,
// which end at end; it returns no iterator if there is nothing to read from from.
func (l *Log) view(shard string, from uint64) (it *pebble.Iterator, end uint64, err error) {
	l.mu.RLock()
	st, ok := l.mu.shards[shard]
	l.mu.RUnlock()
	if !ok {
		return nil, 0, nil
	}
	// The floor and the iterator's view must be one state: truncations (and adopts)
	// apply their batch and raise the floor under st.mu, so a view opened under it
	// holds every page from the floor on. A truncation between the check and the
	// view would start the read past from, or leave it nothing.
	st.mu.Lock()
	defer st.mu.Unlock()
	if from < st.mu.floor {
		return nil, 0, fmt.Errorf("wal: shard %q from offset %d, floor %d: %w", shard, from, st.mu.floor, ErrTruncated)
	}
	// Pebble shows a batch applied with ApplyNoSyncWait before its sync: a page past
	// acked may still fail to sync, or be lost in a crash and its offsets taken by
	// another record after the reopen, so the view ends at acked. acked is a page
	// boundary (an append raises it to its page's end), and every page below it was
	// applied before it rose, so the view holds them.
	end = st.acked.Load()
	if from >= end {
		return nil, end, nil
	}
	it, err = l.db.NewIter(&pebble.IterOptions{LowerBound: shardPrefix(pagePrefix, shard), UpperBound: pageKey(shard, end)})
	if err != nil {
		return nil, 0, fmt.Errorf("wal: read shard %q: %w", shard, err)
	}
	return it, end, nil
}

// scan yields the pages of it from the one holding offset from to end; with clone,
// the pages' records are copies. The view holds every page from from to end, so a
// gap is corruption: at the start, between pages, or at the end.
func scan(it *pebble.Iterator, shard string, from, end uint64, clone bool, yield func(Page, error) bool) {
	// The page holding from is the last one that starts at or before it.
	valid := it.SeekLT(pageKey(shard, from+1))
	if !valid {
		valid = it.First()
	}
	expect := from
	started := false
	for ; valid; valid = it.Next() {
		_, first, ok := parsePageKey(it.Key())
		if !ok {
			yield(Page{}, fmt.Errorf("wal: page key %q: %w", it.Key(), ErrCorrupt))
			return
		}
		v := it.Value()
		if clone {
			v = slices.Clone(v)
		}
		p, err := decodePage(shard, first, v)
		if err != nil {
			yield(Page{}, err)
			return
		}
		if p.NextOffset() <= from {
			continue
		}
		switch {
		case !started && first > from:
			yield(Page{}, &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("the first page after offset %d: the page holding it is missing", from)})
			return
		case started && first != expect:
			yield(Page{}, &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("page follows offset %d: a page is missing", expect)})
			return
		}
		started, expect = true, p.NextOffset()
		if !yield(p, nil) {
			return
		}
	}
	if err := it.Error(); err != nil {
		yield(Page{}, fmt.Errorf("wal: read shard %q: %w", shard, err))
		return
	}
	if expect < end {
		yield(Page{}, &CorruptionError{Shard: shard, Offset: expect, Reason: fmt.Sprintf("the pages end at %d, the shard at %d: pages are missing", expect, end)})
	}
}

// TruncateThrough removes the shard's pages before offset next, which must be a page
// boundary, and raises the shard's floor to it, durably. Offsets stay dense: the next
// append continues where the shard was. An epoch other than the shard's is
// ErrStaleEpoch: an earlier owner's late cleanup cannot touch a newer owner's pages.
//
// Appends to the shard wait for none of it but the entry of the deletion into
// pebble's commit pipeline, and its fsync is shared with theirs: a truncation costs
// an appender no disk round trip of its own.
func (l *Log) TruncateThrough(shard string, epoch, next uint64) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	st := l.state(shard)
	st.truncating.Lock()
	defer st.truncating.Unlock()
	st.mu.Lock()
	floor, end, cur := st.mu.floor, st.mu.next, st.mu.epoch
	st.mu.Unlock()
	switch {
	case epoch != cur:
		return fmt.Errorf("wal: truncate shard %q: epoch %d, the shard's is %d: %w", shard, epoch, cur, ErrStaleEpoch)
	case next <= floor:
		return nil
	case next > end:
		return fmt.Errorf("wal: truncate shard %q through %d past its end %d: %w", shard, next, end, ErrNotPageBoundary)
	}
	// The pages below end do not change while st.truncating is held (appends write
	// at end and past it; only truncations delete), so they are counted without the
	// shard's lock.
	cut, err := l.pagesBelow(shard, floor, next, end)
	if err != nil {
		return err
	}
	b := l.db.NewBatch()
	defer b.Close()
	if err := dropBatch(b, shard, pageKey(shard, next), next); err != nil {
		return err
	}
	st.mu.Lock()
	if epoch != st.mu.epoch {
		st.mu.Unlock()
		return fmt.Errorf("wal: truncate shard %q: epoch %d, the shard's is %d: %w", shard, epoch, st.mu.epoch, ErrStaleEpoch)
	}
	if err := l.db.ApplyNoSyncWait(b, pebble.Sync); err != nil {
		st.mu.Unlock()
		return fmt.Errorf("wal: shard %q: drop pages below %d: %w", shard, next, err)
	}
	if next == end && st.mu.next > end {
		// Pages were appended after the count: the first of them is now the oldest.
		if cut.oldest, err = l.appendedAt(shard, next); err != nil {
			st.mu.Unlock()
			return err
		}
	}
	st.cutLocked(next, cut)
	st.mu.Unlock()
	if err := b.SyncWait(); err != nil {
		err = fmt.Errorf("wal: sync: %w", err)
		l.failed.CompareAndSwap(nil, &err)
		return err
	}
	// The watermark may claim the new floor only once it is durable.
	st.floorMark.Store(next)
	l.changes.Add(1)
	return nil
}

// truncateLocked is TruncateThrough with st.truncating and st.mu held, for an open
// (it holds the lock through its own fsync); next must not be past the shard's end.
func (l *Log) truncateLocked(shard string, st *shardState, next uint64) error {
	if next <= st.mu.floor {
		return nil
	}
	cut, err := l.pagesBelow(shard, st.mu.floor, next, st.mu.next)
	if err != nil {
		return err
	}
	if err := l.dropPages(shard, pageKey(shard, next), next); err != nil {
		return err
	}
	st.cutLocked(next, cut)
	st.floorMark.Store(next)
	l.changes.Add(1)
	return nil
}

// cut is what a truncation removes from a shard's counts, and the appended-at of the
// page it leaves first (zero if it leaves none).
type cut struct {
	pages   int
	payload uint64
	oldest  time.Time
}

// cutLocked raises the shard's floor to next and takes c from its counts; st.mu is
// held. The watermark's floorMark is the caller's to raise once the cut is durable.
func (st *shardState) cutLocked(next uint64, c cut) {
	st.mu.floor = next
	st.forgetGivenLocked(next)
	st.mu.pages -= c.pages
	st.mu.payload -= c.payload
	st.mu.oldest = c.oldest
}

// pagesBelow counts the shard's pages from floor to next, reading their headers
// only, and checks that the last of them ends at next: next must start a page or, at
// end, end the log.
func (l *Log) pagesBelow(shard string, floor, next, end uint64) (cut, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: pageKey(shard, floor), UpperBound: pageKey(shard, next)})
	if err != nil {
		return cut{}, err
	}
	var c cut
	last := floor
	for valid := it.First(); valid; valid = it.Next() {
		_, first, _ := parsePageKey(it.Key())
		h, err := decodeHeader(shard, first, it.Value())
		if err != nil {
			it.Close()
			return cut{}, err
		}
		c.pages++
		c.payload += h.payload
		last = first + uint64(h.count)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return cut{}, fmt.Errorf("wal: truncate shard %q: %w", shard, err)
	}
	if last != next {
		return cut{}, fmt.Errorf("wal: truncate shard %q through %d: %w", shard, next, ErrNotPageBoundary)
	}
	if next < end {
		if c.oldest, err = l.appendedAt(shard, next); err != nil {
			return cut{}, err
		}
	}
	return c, nil
}

// appendedAt reads when the shard's page at offset first was appended.
func (l *Log) appendedAt(shard string, first uint64) (time.Time, error) {
	v, closer, err := l.db.Get(pageKey(shard, first))
	if err != nil {
		return time.Time{}, fmt.Errorf("wal: shard %q: page at %d: %w", shard, first, err)
	}
	defer closer.Close()
	h, err := decodeHeader(shard, first, v)
	return h.appendedAt, err
}

// Fsyncs returns how many times pebble synced its WAL.
func (l *Log) Fsyncs() uint64 {
	if err := l.enter(); err != nil {
		return 0
	}
	defer l.exit()
	return PebbleSyncs(l.db)
}

// PebbleSyncs returns how many times db synced its log, from pebble's own fsync
// latency histogram. Exported for benchmarks that run pebble beside the Log.
func PebbleSyncs(db *pebble.DB) uint64 {
	h := db.Metrics().LogWriter.FsyncLatency
	if h == nil {
		return 0
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

// Close waits for the calls in flight and closes the log; later calls fail with
// ErrClosed. An iteration over Pages holds Close off until it ends.
func (l *Log) Close() error {
	l.ops.Lock()
	if l.ops.closed {
		l.ops.Unlock()
		return ErrClosed
	}
	l.ops.closed = true
	for l.ops.inflight > 0 {
		l.ops.cond.Wait()
	}
	l.ops.Unlock()
	close(l.stopMarks)
	<-l.marksDone
	var errs []error
	if err := l.writeMarksIfChanged(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, l.db.Close(), l.fsCloser.Close())...)
}

// pebbleLogger sends pebble's messages to slog.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) { p.l.Info(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error(msg)
	panic(msg)
}

// applyNoSyncWait is pebble's ApplyNoSyncWait, or, in a broken build without the
// sync, a plain unsynced Apply.
func (l *Log) applyNoSyncWait(b *pebble.Batch, durably *pebble.WriteOptions) error {
	if durably == pebble.NoSync {
		return l.db.Apply(b, durably)
	}
	return l.db.ApplyNoSyncWait(b, durably)
}

// syncWait waits for b's sync, which a broken build never asked for.
func (l *Log) syncWait(b *pebble.Batch) error {
	if broken.Is(broken.AckBeforeSync) {
		return nil
	}
	return b.SyncWait()
}
