package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/internal/fsutil"
)

// Options configure a Log.
type Options struct {
	// Logger receives the log's warnings; nil discards them.
	Logger *slog.Logger
	// SegmentSize is the size at which the log moves to its next segment file.
	// Default 64 MiB; at most 1 GiB.
	SegmentSize int64
	// RecycleSegments is how many files of sealed segments are kept to be written
	// over as new segments: fdatasync on allocated blocks need not persist a new
	// size or allocation. Default 2; negative keeps none.
	RecycleSegments int
	// Clock is the clock stamped on pages and the watermark's pace. Default
	// clock.Real.
	Clock clock.Clock
	// AckedInterval is how often, at most, the acknowledged watermark is rewritten
	// while the log changes (see the l0-acked file in doc.go). Acknowledged records
	// whose loss in the last group before a crash goes undetected otherwise are at
	// most those of the last interval. Default 100 ms.
	AckedInterval time.Duration
	// FS is the file system of the log: its segments, its lock and the l0-acked
	// file. Disk-health checks wrap it. Default vfs.Default; a test passes an
	// in-memory one that forgets unsynced writes, or one that fails calls.
	FS vfs.FS
}

// EnsureDefaults fills in the zero fields.
func (o *Options) EnsureDefaults() {
	if o.SegmentSize <= 0 {
		o.SegmentSize = 64 << 20
	}
	o.SegmentSize = min(o.SegmentSize, 1<<30)
	switch {
	case o.RecycleSegments == 0:
		o.RecycleSegments = 2
	case o.RecycleSegments < 0:
		o.RecycleSegments = 0
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
	w        *writer
	lock     io.Closer // the directory's
	fsCloser io.Closer // stops the disk-health checks
	fs       vfs.FS
	dir      string
	opts     Options

	// changes counts appends, truncations, resets and epochs set; the watermark
	// goroutine rewrites the l0-acked file when it moved since written (the count
	// the last write saw, guarded by marksMu).
	changes   atomic.Uint64
	marksMu   sync.Mutex // serializes writes of the l0-acked file
	written   uint64     // changes when last written; guarded by marksMu
	stopMarks chan struct{}
	marksDone chan struct{}

	mu struct {
		sync.RWMutex
		shards map[string]*shardState
	}
	// ops counts calls in flight; Close waits for them. Calls take no lock to enter
	// and leave: only once closed is set do they wake Close on the cond.
	ops struct {
		inflight atomic.Int64
		closed   atomic.Bool
		mu       sync.Mutex
		cond     sync.Cond
	}
	// failed is set when a write or sync failed: from then on the in-memory
	// offsets may be ahead of the disk, so the Log refuses everything.
	failed atomic.Pointer[error]
	// sink takes every page appended (see ShipTo), and ship says how appends
	// wait for it. Set before the first append.
	sink Sink
	ship ShipOptions
}

// shardState is what the Log knows of one shard: its page index among the rest.
type shardState struct {
	// truncating is held by a truncation from start to end, and taken before mu.
	truncating sync.Mutex
	mu         struct {
		sync.Mutex
		floor   uint64    // first offset not truncated away
		next    uint64    // offset of the next record appended
		pages   []pageRef // from the floor, in offset order
		payload uint64    // record bytes in the shard's pages
		epoch   uint64    // the owner epoch appends and truncations must carry
		resets  uint64    // counts the resets that dropped every page
	}
	// acked is the end of the shard's records known durable: appends raise it after
	// their sync. floorMark is mu.floor once that is durable, epochMark mu.epoch, and
	// resetMark the sequence of the group holding the shard's last reset (0 for
	// none), for the watermark writer, which must not take mu.
	acked     atomic.Uint64
	floorMark atomic.Uint64
	epochMark atomic.Uint64
	resetMark atomic.Uint64
}

// oldestLocked is when the shard's oldest page was appended; zero without pages.
func (st *shardState) oldestLocked() time.Time {
	if len(st.mu.pages) == 0 {
		return time.Time{}
	}
	return time.Unix(0, st.mu.pages[0].appended)
}

func (st *shardState) setFloorLocked(floor uint64) {
	st.mu.floor = floor
	st.floorMark.Store(floor)
}

// cutLocked drops the shard's pages before offset next, a page boundary, and raises
// its floor to it; it returns the pages dropped, whose segments may go once the
// cut is durable. The watermark's floorMark is the caller's to raise then.
func (st *shardState) cutLocked(next uint64) []pageRef {
	i := sort.Search(len(st.mu.pages), func(i int) bool { return st.mu.pages[i].first >= next })
	cut := slices.Clone(st.mu.pages[:i])
	st.mu.pages = slices.Delete(st.mu.pages, 0, i)
	for _, p := range cut {
		st.mu.payload -= p.payload
	}
	st.mu.floor = next
	return cut
}

// Open opens (creating it if needed) the log in dir and loads every shard's state.
// A directory that holds a log of an earlier format is refused with ErrFormat.
func Open(dir string, opts Options) (*Log, error) {
	opts.EnsureDefaults()
	fs, fsCloser := vfs.WithDiskHealthChecks(opts.FS, 5*time.Second, nil, slowDisk(opts.Logger))
	if err := fsutil.MkdirAll(fs, dir); err != nil {
		fsCloser.Close()
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	// Before anything is read: every name the open finds is made durable, the
	// directory's own and those above it, created by this open or not. A process
	// killed before its directory fsync (a mkdir's, a rotation's rename) leaves
	// names only in the page cache; an open that read and built on them, then a
	// power loss, would lose the directory whole, or bring a renamed segment back
	// under its old name with this life's groups in it.
	if err := fsutil.SyncPath(fs, dir); err != nil {
		fsCloser.Close()
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	lock, err := fs.Lock(fs.PathJoin(dir, "LOCK"))
	if err != nil {
		fsCloser.Close()
		return nil, fmt.Errorf("wal: open %s: %w", dir, err)
	}
	l := &Log{lock: lock, fsCloser: fsCloser, fs: fs, dir: dir, opts: opts}
	l.ops.cond.L = &l.ops.mu
	l.mu.shards = make(map[string]*shardState)
	if err := l.recover(); err != nil {
		if l.w != nil {
			l.w.close()
		}
		lock.Close()
		fsCloser.Close()
		return nil, err
	}
	l.stopMarks, l.marksDone = make(chan struct{}), make(chan struct{})
	go l.syncMarks(l.stopMarks, l.marksDone)
	return l, nil
}

// recover replays the segments, checks what they hold against the acknowledged
// watermark, and starts the writer on a new segment.
func (l *Log) recover() error {
	marks, err := readMarks(l.fs, l.dir)
	if err != nil {
		return err
	}
	rec, err := recoverSegments(l.fs, l.dir, l.opts)
	if err != nil {
		return err
	}
	logged := make(map[string]checkpointed, len(rec.shards))
	for id, r := range rec.shards {
		st := l.stateLocked(id)
		st.setFloorLocked(r.floor)
		st.mu.epoch = r.epoch
		st.epochMark.Store(r.epoch)
		st.resetMark.Store(r.reset)
		st.mu.pages = r.pages
		st.mu.next = r.floor
		if n := len(r.pages); n > 0 {
			st.mu.next = r.pages[n-1].next()
		}
		for _, p := range r.pages {
			st.mu.payload += p.payload
		}
		logged[id] = checkpointed{shard: id, epoch: r.epoch, floor: r.floor}
	}
	l.w = newWriter(l.fs, l.dir, l.opts, rec.segs, rec.pool, logged, rec.seq)
	if err := l.checkMarks(marks, rec.first); err != nil {
		return err
	}
	// Only a log the watermark accepts is written to: a refused one stays as found,
	// every file under its name and with its bytes.
	if err := rec.removeLeftovers(l.fs); err != nil {
		return err
	}
	if err := rec.settle(l.fs); err != nil {
		return err
	}
	if err := l.w.start(); err != nil {
		return err
	}
	l.w.mu.Lock()
	l.w.dropObsoleteLocked()
	l.w.mu.Unlock()
	for _, st := range l.mu.shards {
		st.acked.Store(st.mu.next)
	}
	// A kill before the watermark caught up leaves it behind the log. Claim what was
	// recovered now, records, floors, epochs and resets: nothing else would rewrite
	// it before a change, and a clean Close with none would leave what was replayed
	// uncovered. Everything replayed is durable: settle synced the newest segment,
	// and every older one was synced before the next was made. A reset the
	// watermark names in a group the log no longer holds is not claimed: the pages
	// it dropped are gone with that group.
	if !maps.Equal(marks, l.marks()) {
		return l.writeMarksNow()
	}
	return nil
}

// stateLocked returns the shard's state, creating it; l.mu must be held for writing
// (or the Log not yet shared).
func (l *Log) stateLocked(shard string) *shardState {
	st, ok := l.mu.shards[shard]
	if !ok {
		st = &shardState{}
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

// enter admits a call, which must call exit when done with the files.
func (l *Log) enter() error {
	if errp := l.failed.Load(); errp != nil {
		return fmt.Errorf("%w: %v", ErrFailed, *errp) // not the earlier error's sentinels: this call wrote nothing
	}
	l.ops.inflight.Add(1)
	if l.ops.closed.Load() {
		l.exit()
		return ErrClosed
	}
	return nil
}

func (l *Log) exit() {
	if l.ops.inflight.Add(-1) == 0 && l.ops.closed.Load() {
		l.ops.mu.Lock()
		l.ops.cond.Broadcast()
		l.ops.mu.Unlock()
	}
}

// fail makes the Log refuse every later call, after a write or sync whose outcome
// is unknown, and returns err as that outcome.
func (l *Log) fail(what string, err error) error {
	err = fmt.Errorf("wal: %s: %w: %w", what, ErrUnknownOutcome, err)
	l.failed.CompareAndSwap(nil, &err)
	return err
}

// Append writes recs as one page of shard and returns the offset of the first record
// once the page is durable. The caller validates shard ids and record sizes; an empty
// batch is refused, and so is an epoch other than the shard's (ErrStaleEpoch). A
// context cancelled before the page enters the log writes nothing.
func (l *Log) Append(ctx context.Context, shard string, epoch uint64, recs [][]byte) (uint64, error) {
	if len(recs) == 0 {
		return 0, ErrEmptyBatch
	}
	if err := l.enter(); err != nil {
		return 0, err
	}
	defer l.exit()
	st := l.state(shard)
	if err := l.waitRoom(ctx); err != nil {
		return 0, err
	}
	// Under the shard's lock: take the offsets and add the page to the filling
	// group, so that pages of one shard reach the log in offset order. The sync is
	// waited for outside the lock, where appends of this and other shards share it.
	st.mu.Lock()
	if err := ctx.Err(); err != nil {
		st.mu.Unlock()
		return 0, err
	}
	if cur := st.mu.epoch; epoch != cur {
		st.mu.Unlock()
		return 0, fmt.Errorf("wal: shard %q: epoch %d, the shard's is %d: %w", shard, epoch, cur, ErrStaleEpoch)
	}
	first := st.mu.next
	if broken.Is(broken.ReuseOffset) && first > 0 && len(st.mu.pages)%5 == 4 {
		first--
	}
	now := l.opts.Clock.Now()
	l.w.mu.Lock()
	ref, err := l.w.addPageLocked(shard, first, now.UnixNano(), recs, false)
	l.w.mu.Unlock()
	if err != nil {
		st.mu.Unlock()
		return 0, l.fail("append", err)
	}
	var ship Shipment
	if l.sink != nil {
		// Taken under the lock, so that the sink gets the shard's pages in offset
		// order; shipped while the fsync runs.
		ship = l.sink.Take(shard, epoch, first, recs)
	}
	st.mu.pages = append(st.mu.pages, ref)
	st.mu.next = first + uint64(len(recs))
	st.mu.payload += ref.payload
	resets := st.mu.resets
	st.mu.Unlock()

	if err := ref.g.wait(); err != nil {
		return 0, l.fail("sync", err)
	}
	if l.ship.Remote && ship != nil {
		// The page is durable here, and must be on the object store too, where
		// the shard's next owner looks, before it is acknowledged or read. A page
		// that fails to ship stays in the log, unacknowledged, like one whose
		// reply a crash lost.
		if err := ship.Wait(ctx); err != nil {
			return 0, fmt.Errorf("wal: ship: %w: %w", ErrUnknownOutcome, err)
		}
	}
	// Appends of a shard sync in offset order, but may return out of it. A reset
	// since the page was added (an adoption of a superseded backlog, an import)
	// dropped it: the shard's acknowledged end is the reset's then.
	st.mu.Lock()
	if end := first + uint64(len(recs)); st.mu.resets == resets && st.acked.Load() < end {
		st.acked.Store(end)
	}
	st.mu.Unlock()
	l.changes.Add(1)
	return first, nil
}

// Settle declares that no append of the shard is in flight, and raises its
// acknowledged end to its next offset: every page the shard holds was synced then
// (a sync that failed fails the whole log, and Settle with it). The pages past the
// acknowledged end are those whose appends ended with an unknown outcome after
// their sync — a wait for their shipment that ended, a lease that ran out — and
// from here on reads and seals cover them, as a takeover on another machine would
// read them from the tail: such a record may be in the shard's history, and
// whoever seals the shard must keep it rather than give its offset to another.
func (l *Log) Settle(shard string) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	st := l.state(shard)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.acked.Load() < st.mu.next {
		st.acked.Store(st.mu.next)
		l.changes.Add(1)
	}
	return nil
}

// ShardInfo is what the Log knows of a shard's unsealed pages.
type ShardInfo struct {
	// Floor is the first offset still in the log: everything before it was
	// truncated (sealed).
	Floor uint64
	// Next is the offset the next appended record gets.
	Next uint64
	// Acknowledged is the end of the records known durable: where a read of
	// the pages ends (see Pages). Between it and Next are appends still syncing.
	Acknowledged uint64
	Pages        int
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
	return ShardInfo{Floor: st.mu.floor, Next: st.mu.next, Acknowledged: st.acked.Load(), Pages: len(st.mu.pages), UnsealedBytes: st.mu.payload, Oldest: st.oldestLocked(), Epoch: st.mu.epoch}
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
		if len(st.mu.pages) > 0 {
			out = append(out, shard)
		}
		st.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// Known returns every shard the log holds a state of (an epoch, a watermark or
// pages), sorted.
func (l *Log) Known() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return slices.Sorted(maps.Keys(l.mu.shards))
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
		refs, pinned, err := l.view(shard, from)
		if err != nil {
			yield(Page{}, err)
			return
		}
		defer l.w.unpin(pinned)
		var buf []byte
		for len(refs) > 0 {
			n := runOf(refs)
			run, err := l.readRun(shard, refs[:n], &buf)
			if err != nil && n > 1 {
				// The bytes between the pages (another shard's, say) may be what
				// cannot be read: read the first page alone, and go on from there.
				n = 1
				run, err = l.readRun(shard, refs[:1], &buf)
			}
			for _, r := range refs[:n] {
				var p Page
				if err == nil {
					b := run[r.at()-refs[0].at():][:r.n]
					if clone {
						// Each page its own memory, of its own size: a record kept
						// holds its page, not the run, and nothing the log reuses.
						b = bytes.Clone(b)
					}
					p, err = l.decodeRef(shard, r, b)
				}
				if err != nil {
					yield(Page{}, err)
					return
				}
				if !yield(p, nil) {
					return
				}
			}
			refs = refs[n:]
		}
	}
}

// Reads of pages take runs of them in one read: those that follow each other in
// one segment with at most maxRunGap bytes between them (a group's header, a
// floor entry, a page of another shard), up to maxRunBytes in all. A shard
// appended to by one writer at a time has a page in every group, and a seal of
// it then reads a megabyte per call instead of a page.
const (
	maxRunGap   = 4 << 10
	maxRunBytes = 1 << 20
)

// runOf returns how many of refs, from the first, one read takes.
func runOf(refs []pageRef) int {
	start := refs[0].at()
	end := start + int64(refs[0].n)
	n := 1
	for ; n < len(refs); n++ {
		r := refs[n]
		at := r.at()
		if r.g.seg != refs[0].g.seg || at < end || at-end > maxRunGap || at+int64(r.n)-start > maxRunBytes {
			break
		}
		end = at + int64(r.n)
	}
	return n
}

// readRun reads the bytes from the first of refs, one run, to the end of the last
// into *buf, which it reuses if large enough.
func (l *Log) readRun(shard string, refs []pageRef, buf *[]byte) ([]byte, error) {
	first, last := refs[0], refs[len(refs)-1]
	start := first.at()
	size := int(last.at() + int64(last.n) - start)
	if cap(*buf) < size {
		*buf = make([]byte, size)
	}
	b := (*buf)[:size]
	if n, err := first.g.seg.r.ReadAt(b, start); n < len(b) {
		return nil, fmt.Errorf("wal: read shard %q at offset %d: %w", shard, first.first, errors.Join(err, io.ErrUnexpectedEOF))
	}
	return b, nil
}

// Extent returns where a read of the shard's durable pages from offset from ends
// if it takes at least one page and stops at the first page boundary at or past
// budget record bytes (a seal's budget): next, the offset after its last record,
// and whether durable pages are left past it. With nothing durable at or past
// from, next is from. Pages from from yield exactly the records up to next, unless
// a reset of the shard comes between.
func (l *Log) Extent(shard string, from, budget uint64) (next uint64, cut bool, err error) {
	if err := l.enter(); err != nil {
		return 0, false, err
	}
	defer l.exit()
	next = from
	err = l.durable(shard, from, func(pages []pageRef) {
		var bytes uint64
		for _, p := range pages {
			if next > from && bytes >= budget {
				cut = true
				return
			}
			next, bytes = p.next(), bytes+p.payload
		}
	})
	if err != nil {
		return 0, false, err
	}
	return next, cut, nil
}

// view checks from against the shard's floor and returns the pages from the one
// holding from to the end of the durable ones, with their segments pinned.
func (l *Log) view(shard string, from uint64) (refs []pageRef, pinned []*segment, err error) {
	err = l.durable(shard, from, func(pages []pageRef) {
		if len(pages) > 0 {
			// Pinned before a truncation can drop them.
			refs = slices.Clone(pages)
			pinned = l.w.pin(refs)
		}
	})
	return refs, pinned, err
}

// durable calls f with the shard's durable pages from the one holding offset from,
// under the shard's lock, so that they and the floor checked against from are one
// state; a shard the log does not know has none.
func (l *Log) durable(shard string, from uint64, f func([]pageRef)) error {
	l.mu.RLock()
	st, ok := l.mu.shards[shard]
	l.mu.RUnlock()
	if !ok {
		f(nil)
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if from < st.mu.floor {
		return fmt.Errorf("wal: shard %q from offset %d, floor %d: %w", shard, from, st.mu.floor, ErrTruncated)
	}
	// A page past acked may still fail to sync, or be lost in a crash and its
	// offsets taken by another record after the reopen, so reads end at acked,
	// a page boundary (an append raises it to its page's end).
	end := st.acked.Load()
	pages := st.mu.pages
	i := sort.Search(len(pages), func(i int) bool { return pages[i].next() > from })
	j := sort.Search(len(pages), func(i int) bool { return pages[i].first >= end })
	f(pages[i:max(i, j)])
	return nil
}

// readPage reads and checks the page r of shard into *buf, which it reuses if large
// enough.
func (l *Log) readPage(shard string, r pageRef, buf *[]byte) (Page, error) {
	b, err := l.readRun(shard, []pageRef{r}, buf)
	if err != nil {
		return Page{}, err
	}
	return l.decodeRef(shard, r, b)
}

// decodeRef decodes and checks b, the bytes of the page r of shard.
func (l *Log) decodeRef(shard string, r pageRef, b []byte) (Page, error) {
	p, err := decodePage(shard, r.first, b[pageKeyLen(shard):])
	if err != nil {
		return Page{}, err
	}
	if p.NextOffset() != r.next() {
		return Page{}, &CorruptionError{Shard: shard, Offset: r.first, Reason: fmt.Sprintf("%d records, the log said %d", len(p.Records), r.count)}
	}
	return p, nil
}

// TruncateThrough removes the shard's pages before offset next, which must be a page
// boundary, and raises the shard's floor to it, durably. Offsets stay dense: the next
// append continues where the shard was. An epoch other than the shard's is
// ErrStaleEpoch: an earlier owner's late cleanup cannot touch a newer owner's pages.
//
// Appends to the shard wait for none of it but the entry of the floor into the
// filling group, whose fsync is shared with theirs: a truncation costs an appender
// no disk round trip of its own.
func (l *Log) TruncateThrough(shard string, epoch, next uint64) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	st := l.state(shard)
	st.truncating.Lock()
	defer st.truncating.Unlock()
	st.mu.Lock()
	switch {
	case epoch != st.mu.epoch:
		defer st.mu.Unlock()
		return fmt.Errorf("wal: truncate shard %q: epoch %d, the shard's is %d: %w", shard, epoch, st.mu.epoch, ErrStaleEpoch)
	case next <= st.mu.floor:
		st.mu.Unlock()
		return nil
	case next > st.mu.next || !st.boundaryLocked(next):
		defer st.mu.Unlock()
		return fmt.Errorf("wal: truncate shard %q through %d: %w", shard, next, ErrNotPageBoundary)
	}
	g, err := l.w.addShardEntry(entryFloor, shard, next)
	if err != nil {
		st.mu.Unlock()
		return l.fail("truncate", err)
	}
	cut := st.cutLocked(next)
	st.mu.Unlock()
	if err := g.wait(); err != nil {
		return l.fail("sync", err)
	}
	// The watermark may claim the new floor, and the segments lose the pages, only
	// once the floor is durable.
	st.floorMark.Store(next)
	l.w.drop(cut)
	l.changes.Add(1)
	return nil
}

// boundaryLocked reports whether offset next starts one of the shard's pages or ends
// the last.
func (st *shardState) boundaryLocked(next uint64) bool {
	if next == st.mu.next {
		return true
	}
	pages := st.mu.pages
	i := sort.Search(len(pages), func(i int) bool { return pages[i].first >= next })
	return i < len(pages) && pages[i].first == next
}

// truncateLocked is TruncateThrough with st.truncating and st.mu held, for an open
// (it holds the lock through its own fsync); next must not be past the shard's end.
func (l *Log) truncateLocked(shard string, st *shardState, next uint64) error {
	if next <= st.mu.floor {
		return nil
	}
	if !st.boundaryLocked(next) {
		return fmt.Errorf("wal: truncate shard %q through %d: %w", shard, next, ErrNotPageBoundary)
	}
	if _, err := l.logShardEntry(entryFloor, shard, next); err != nil {
		return err
	}
	l.w.drop(st.cutLocked(next))
	st.floorMark.Store(next)
	l.changes.Add(1)
	return nil
}

// logShardEntry writes a floor, reset or epoch entry, waits for its sync, and
// returns the sequence of its group.
func (l *Log) logShardEntry(kind byte, shard string, v uint64) (uint64, error) {
	g, err := l.w.addShardEntry(kind, shard, v)
	if err == nil {
		err = g.wait()
	}
	if err != nil {
		return 0, l.fail("sync", err)
	}
	return g.seq, nil
}

// Fsyncs returns how many times the log synced a segment.
func (l *Log) Fsyncs() uint64 { return l.w.syncs.Load() }

// Commits counts the log's group commits: the groups written and synced, their
// bytes, and the time its flusher spent in the writes and in the fsyncs, on the
// log's clock. A call's time is as the flusher saw it: the disk's, and any wait
// for a core once the call returned. Over a span, the time that is in neither is
// the flusher waiting for entries, or for a core to take them.
type Commits struct {
	Groups      uint64
	Bytes       uint64
	Write, Sync time.Duration
}

// Commits returns the log's group commits so far.
func (l *Log) Commits() Commits {
	return Commits{
		Groups: l.w.syncs.Load(), Bytes: l.w.written.Load(),
		Write: time.Duration(l.w.writeNanos.Load()), Sync: time.Duration(l.w.syncNanos.Load()),
	}
}

// Segments returns how many segment files the log holds: those with pages not yet
// sealed (and the current one), and those kept to be reused.
func (l *Log) Segments() (live, pooled int) { return l.w.segments() }

// Close waits for the calls in flight and closes the log; later calls fail with
// ErrClosed. An iteration over Pages holds Close off until it ends.
func (l *Log) Close() error {
	if l.ops.closed.Swap(true) {
		return ErrClosed
	}
	l.ops.mu.Lock()
	for l.ops.inflight.Load() > 0 {
		l.ops.cond.Wait()
	}
	l.ops.mu.Unlock()
	close(l.stopMarks)
	<-l.marksDone
	var errs []error
	if err := l.writeMarksIfChanged(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, l.w.close(), l.lock.Close(), l.fsCloser.Close())...)
}
