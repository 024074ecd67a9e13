package tail

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/clock"
)

// ErrClosed reports a flusher closed before a page it was given was shipped.
var ErrClosed = errors.New("tail: flusher closed")

// FlushOptions configure a Flusher.
type FlushOptions struct {
	// Interval is the least time between the starts of two flushes while pages
	// keep coming. Default 50 ms.
	Interval time.Duration
	// Bytes starts a flush at once when this many record bytes are pending.
	// Default 4 MiB.
	Bytes int
	// Retry is the wait before a flush whose put failed is put again. Default
	// 100 ms.
	Retry time.Duration
	// Clock is the clock of Interval and Retry. Default clock.Real.
	Clock clock.Clock
	// Shipped, if set, is told of each object shipped, from the flusher's own
	// goroutine: it must not block.
	Shipped func(ShipInfo)
	// Next, if set, gives the flusher a stream when it has none (fenced is nil:
	// the first, before the first put) and when its stream is fenced (fenced is
	// that stream), and reports which shards' pages, by shard and epoch, must not
	// be shipped in it: their pages fail with ErrFenced, now and whenever given.
	// The flusher's pages not shipped in the fenced stream go in the new one, and
	// its tickets resolve there. Next runs on the flusher's goroutine and retries
	// as it sees fit: an error stops the flusher, failing every page with it.
	// Without Next a fence stops the flusher.
	Next func(ctx context.Context, fenced *Stream) (*Stream, Taken, error)
}

// Taken reports whether the pages of shard under epoch were taken over by another
// owner: none of them may be shipped from then on. A nil Taken takes nothing.
type Taken func(shard string, epoch uint64) bool

// Position is a place in an instance's tail: a sequence of one incarnation's
// stream. Positions order by incarnation, then sequence; a reader that starts at
// one reads the rest of its incarnation and every later one.
type Position struct {
	Incarnation, Sequence uint64
}

// Before reports whether p comes before q.
func (p Position) Before(q Position) bool {
	return p.Incarnation < q.Incarnation || (p.Incarnation == q.Incarnation && p.Sequence < q.Sequence)
}

// ShipInfo is one object shipped.
type ShipInfo struct {
	Sequence uint64
	Bytes    int           // record bytes
	Took     time.Duration // from the first put to the one that succeeded
	// Waited is, for each page the object holds, the time from being given to
	// being shipped: in Remote mode, what its append waited for the tail.
	Waited []time.Duration
}

func (o *FlushOptions) ensureDefaults() {
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Bytes <= 0 {
		o.Bytes = 4 << 20
	}
	if o.Retry <= 0 {
		o.Retry = 100 * time.Millisecond
	}
	o.Clock = clock.OrReal(o.Clock)
}

// FlushStats count what a flusher did.
type FlushStats struct {
	Puts, Bytes, Failures uint64 // objects shipped, their bytes, puts that failed
	Pending               int    // record bytes given and not yet shipped
	// Oldest is when the oldest page not yet shipped was given; zero when none.
	Oldest time.Time
}

// Ticket is a page given to a flusher: Wait returns once it is shipped.
type Ticket struct {
	done  chan struct{}
	err   error
	shard string
	epoch uint64
	at    Position // of the object that holds the page, once shipped
	// given is when the page was given.
	given time.Time
}

// State reports, without waiting, whether the page's shipment ended, and how: the
// sequence of the object that holds it, or the error.
func (t *Ticket) State() (at Position, done bool, err error) {
	select {
	case <-t.done:
		return t.at, true, t.err
	default:
		return Position{}, false, nil
	}
}

// fail resolves t with err.
func (t *Ticket) fail(err error) {
	t.err = err
	close(t.done)
}

// Wait returns nil once the page is in a durable tail object, with every page given
// before it; ErrFenced if the stream was fenced first, ErrClosed if the flusher
// closed first; or ctx's error, in which case the page may still be shipped.
func (t *Ticket) Wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// batch is the pages of one object to come: a section per shard.
type batch struct {
	added    time.Time // when its first page was given
	sections []Section
	index    map[string]int // shard → its section
	bytes    int
	tickets  []*Ticket
}

// Flusher ships the pages given to it, for every shard at once, as one tail object
// per flush on its stream: a flush starts when pages are pending and Interval has
// passed since the previous one started, or at once past Bytes. An idle flusher
// writes nothing. Pages of a shard must be given in offset order, contiguous.
type Flusher struct {
	stream  *Stream // the loop's alone; nil until the first (see FlushOptions.Next)
	opts    FlushOptions
	wake    chan struct{}
	done    chan struct{}
	started chan struct{} // closed once the flusher has a stream
	// ctx ends when Close gives up waiting: the put in flight is abandoned.
	ctx    context.Context
	cancel context.CancelFunc
	nextAt atomic.Pointer[Position] // mu.next, set with it

	mu struct {
		sync.Mutex
		batches []*batch // the pending objects, in order; the last one takes pages
		stats   FlushStats
		err     error // ErrFenced or ErrClosed once the flusher stopped
		// shipped is closed and replaced each time an object is shipped or the
		// flusher stops: WaitRoom waits on it.
		shipped chan struct{}
		// gathering counts the Gather calls not done: no flush starts meanwhile.
		gathering int
		// next is the position of the next object put, or of the one in flight:
		// every page given from now on goes in an object at or after it. The
		// atomic next outside mu is a copy, for Next.
		next  Position
		taken Taken
	}
}

// NewFlusher starts a flusher on stream; with a nil stream, on the one
// opts.Next gives it before its first put.
func NewFlusher(stream *Stream, opts FlushOptions) *Flusher {
	opts.ensureDefaults()
	f := &Flusher{opts: opts, wake: make(chan struct{}, 1), done: make(chan struct{}), started: make(chan struct{})}
	if stream != nil {
		f.setStreamLocked(stream, nil)
	}
	f.mu.shipped = make(chan struct{})
	f.ctx, f.cancel = context.WithCancel(context.Background())
	go f.loop()
	return f
}

// Add gives the flusher one page of shard, appended under epoch, whose records have
// offsets from first on; it copies them. A page under another epoch than the
// shard's pending ones goes in the next object, since an object holds one section
// per shard. A page no object can hold (see Encode) fails its ticket with
// ErrInvalid at once, and nothing else.
func (f *Flusher) Add(shard string, epoch, first uint64, recs [][]byte) *Ticket {
	t := &Ticket{done: make(chan struct{}), shard: shard, epoch: epoch, given: f.opts.Clock.Now()}
	if err := checkPage(shard, first, recs); err != nil {
		t.fail(err)
		return t
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.err != nil {
		t.fail(f.mu.err)
		return t
	}
	if f.mu.taken != nil && f.mu.taken(shard, epoch) {
		t.fail(takenError(shard, epoch))
		return t
	}
	b := f.current()
	i, ok := b.index[shard]
	if ok && (b.sections[i].Epoch != epoch || b.sections[i].First+uint64(len(b.sections[i].Records)) != first) {
		b = f.next()
		ok = false
	}
	if len(b.tickets) == 0 {
		b.added = t.given // the batch's age, which bounds Local mode's window
	}
	if !ok {
		i = len(b.sections)
		b.index[shard] = i
		b.sections = append(b.sections, Section{Shard: shard, Epoch: epoch, First: first})
	}
	// One copy of the page's records, in one allocation.
	n := 0
	for _, r := range recs {
		n += len(r)
	}
	buf := make([]byte, 0, n)
	for _, r := range recs {
		buf = append(buf, r...)
		b.sections[i].Records = append(b.sections[i].Records, buf[len(buf)-len(r):len(buf):len(buf)])
	}
	b.bytes += n
	f.mu.stats.Pending += n
	b.tickets = append(b.tickets, t)
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return t
}

// current is the batch taking pages, f.mu held.
func (f *Flusher) current() *batch {
	if len(f.mu.batches) == 0 {
		return f.next()
	}
	return f.mu.batches[len(f.mu.batches)-1]
}

// next starts a new batch, f.mu held.
func (f *Flusher) next() *batch {
	b := &batch{index: map[string]int{}}
	f.mu.batches = append(f.mu.batches, b)
	return b
}

// Gather holds flushes back until done is called, so that the pages given
// meanwhile (a shard's backlog, page after page) go out together rather than the
// first of them alone and the rest an interval later; a batch that reaches Bytes
// goes all the same.
func (f *Flusher) Gather() (done func()) {
	f.mu.Lock()
	f.mu.gathering++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.mu.gathering--
			f.mu.Unlock()
			select {
			case f.wake <- struct{}{}:
			default:
			}
		})
	}
}

// Done is closed once the flusher stopped: closed, or fenced.
func (f *Flusher) Done() <-chan struct{} { return f.done }

// Err is why the flusher stopped, once Done is closed: ErrFenced or ErrClosed.
func (f *Flusher) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.err
}

// Stats returns the flusher's counters.
func (f *Flusher) Stats() FlushStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.mu.stats
	for _, b := range f.mu.batches {
		if len(b.tickets) > 0 {
			st.Oldest = b.added
			break
		}
	}
	return st
}

// takenError is the error of a page of a shard taken over.
func takenError(shard string, epoch uint64) error {
	return fmt.Errorf("%w: shard %q was taken over at epoch %d", ErrFenced, shard, epoch)
}

// Started is closed once the flusher has a stream: from then on Next is a
// position of it.
func (f *Flusher) Started() <-chan struct{} { return f.started }

// Next is a position at or before that of every object holding a page given from
// now on: the object in flight, or else the next one. Before the flusher has a
// stream (see Started), it is the zero Position.
func (f *Flusher) Next() Position {
	if p := f.nextAt.Load(); p != nil {
		return *p
	}
	return Position{}
}

// setNextLocked sets the position of the next object, f.mu held.
func (f *Flusher) setNextLocked(p Position) {
	f.mu.next = p
	f.nextAt.Store(&p)
}

// Bound returns a position at or before that of the object that holds, or will
// hold, t's page, a page given to f: that object's once shipped, or else f's Next.
// ok is false if the page's shipment failed. The two are read under f.mu, which
// ship holds from moving Next past the object it put to resolving that object's
// tickets: read apart, a page just put looked unshipped beside a Next already past
// its object.
func (f *Flusher) Bound(t *Ticket) (at Position, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch p, done, err := t.State(); {
	case done && err != nil:
		return Position{}, false
	case done:
		return p, true
	}
	return f.mu.next, true
}

// setStreamLocked makes s the flusher's stream, and taken what it refuses, f.mu
// held (or f not yet shared).
func (f *Flusher) setStreamLocked(s *Stream, taken Taken) {
	f.stream = s
	f.setNextLocked(Position{Incarnation: s.Incarnation(), Sequence: s.Next()})
	f.mu.taken = taken
	select {
	case <-f.started:
	default:
		close(f.started)
	}
}

// dropTakenLocked fails the pending pages that taken refuses, and takes their
// sections out of the batches, f.mu held.
func (f *Flusher) dropTakenLocked(taken Taken) {
	if taken == nil {
		return
	}
	var kept []*batch
	for _, b := range f.mu.batches {
		var tickets []*Ticket
		for _, t := range b.tickets {
			if taken(t.shard, t.epoch) {
				t.fail(takenError(t.shard, t.epoch))
			} else {
				tickets = append(tickets, t)
			}
		}
		b.tickets = tickets
		var sections []Section
		clear(b.index)
		for _, s := range b.sections {
			if taken(s.Shard, s.Epoch) {
				n := sectionBytes(s)
				b.bytes -= n
				f.mu.stats.Pending -= n
				continue
			}
			b.index[s.Shard] = len(sections)
			sections = append(sections, s)
		}
		b.sections = sections
		if len(b.tickets) > 0 || b == f.mu.batches[len(f.mu.batches)-1] {
			kept = append(kept, b)
		}
	}
	f.mu.batches = kept
}

func sectionBytes(s Section) int {
	n := 0
	for _, r := range s.Records {
		n += len(r)
	}
	return n
}

// WaitRoom waits until fewer than maxBytes of record bytes are pending and the
// oldest pending page was given less than maxAge ago, or ctx ends, or the flusher
// stopped (its error). A zero bound is no bound.
func (f *Flusher) WaitRoom(ctx context.Context, maxBytes int, maxAge time.Duration) error {
	for {
		st := f.Stats()
		f.mu.Lock()
		err, shipped := f.mu.err, f.mu.shipped
		f.mu.Unlock()
		if err != nil {
			return err
		}
		full := maxBytes > 0 && st.Pending >= maxBytes
		old := maxAge > 0 && !st.Oldest.IsZero() && f.opts.Clock.Now().Sub(st.Oldest) >= maxAge
		if !full && !old {
			return nil
		}
		select {
		case <-shipped:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// shippedLocked wakes the WaitRoom calls, f.mu held.
func (f *Flusher) shippedLocked() {
	close(f.mu.shipped)
	f.mu.shipped = make(chan struct{})
}

// Close stops the flusher once what it was given is shipped, or when ctx ends,
// abandoning the put in flight; pages not shipped then fail with ErrClosed.
func (f *Flusher) Close(ctx context.Context) error {
	f.mu.Lock()
	if f.mu.err == nil {
		f.mu.err = ErrClosed
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	defer f.cancel()
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		f.cancel()
		<-f.done
		return ctx.Err()
	}
}

// stop fails every pending page with err, f's loop alone calling it as it ends.
func (f *Flusher) stop(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.mu.batches {
		for _, t := range b.tickets {
			t.fail(err)
		}
	}
	f.mu.batches = nil
	f.mu.stats.Pending = 0
	if !errors.Is(f.mu.err, ErrFenced) {
		f.mu.err = err
	}
	f.shippedLocked()
}

func (f *Flusher) loop() {
	defer close(f.done)
	if f.stream == nil {
		// The first stream, at once: a takeover needs its position before it
		// gives the flusher anything.
		if err := f.restart(nil); err != nil {
			f.stop(err)
			return
		}
	}
	// paced receives once Interval has passed since the previous flush started;
	// nil once it did, or before the first flush.
	var paced <-chan time.Time
	for {
		f.mu.Lock()
		var b *batch
		if len(f.mu.batches) > 0 && len(f.mu.batches[0].tickets) > 0 {
			b = f.mu.batches[0]
		}
		closing, full := f.mu.err != nil, b != nil && (len(f.mu.batches) > 1 || b.bytes >= f.opts.Bytes)
		gathering := f.mu.gathering > 0
		f.mu.Unlock()
		if f.ctx.Err() != nil || (b == nil && closing) {
			f.stop(ErrClosed)
			return
		}
		if b == nil || (gathering && !full && !closing) {
			select {
			case <-f.wake:
			case <-f.ctx.Done():
			}
			continue
		}
		if paced != nil && !full && !closing {
			select {
			case <-paced:
				paced = nil
			case <-f.wake:
			case <-f.ctx.Done():
			}
			continue
		}
		// Take the batch: pages given from now on go in the next one.
		f.mu.Lock()
		if len(f.mu.batches) == 1 {
			f.next()
		}
		f.mu.Unlock()
		paced = f.opts.Clock.After(f.opts.Interval)
		if err := f.ship(b); err != nil {
			f.stop(err)
			return
		}
	}
}

// restart gets the flusher its next stream from opts.Next, after fenced (nil: its
// first), and drops the pages of the shards it reports taken.
func (f *Flusher) restart(fenced *Stream) error {
	if f.opts.Next == nil {
		return fmt.Errorf("%w: a flusher without a stream", ErrInvalid)
	}
	s, taken, err := f.opts.Next(f.ctx, fenced)
	if err != nil {
		if f.ctx.Err() != nil {
			return ErrClosed
		}
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setStreamLocked(s, taken)
	f.dropTakenLocked(taken)
	f.shippedLocked()
	return nil
}

// ship puts b, again and again while the outcome is unknown, and resolves its
// tickets. It returns ErrFenced once the stream was fenced, and ErrClosed once
// Close gave up waiting.
func (f *Flusher) ship(b *batch) error {
	start := f.opts.Clock.Now()
	for {
		if len(b.tickets) == 0 {
			// Every page of it was taken over while its stream was replaced.
			f.mu.Lock()
			if len(f.mu.batches) > 0 && f.mu.batches[0] == b {
				f.mu.batches = f.mu.batches[1:]
			}
			f.mu.Unlock()
			return nil
		}
		seq, err := f.stream.Put(f.ctx, b.sections)
		f.mu.Lock()
		if err == nil {
			at := Position{Incarnation: f.stream.Incarnation(), Sequence: seq}
			f.mu.batches = f.mu.batches[1:]
			f.setNextLocked(Position{Incarnation: f.stream.Incarnation(), Sequence: f.stream.Next()})
			f.shippedLocked()
			f.mu.stats.Puts++
			f.mu.stats.Bytes += uint64(b.bytes)
			f.mu.stats.Pending -= b.bytes
			now := f.opts.Clock.Now()
			var waited []time.Duration
			if f.opts.Shipped != nil {
				waited = make([]time.Duration, len(b.tickets))
			}
			for i, t := range b.tickets {
				t.at = at
				if waited != nil {
					waited[i] = now.Sub(t.given)
				}
				close(t.done)
			}
			f.mu.Unlock()
			if f.opts.Shipped != nil {
				f.opts.Shipped(ShipInfo{Sequence: seq, Bytes: b.bytes, Took: now.Sub(start), Waited: waited})
			}
			return nil
		}
		f.mu.stats.Failures++
		if errors.Is(err, ErrFenced) && f.opts.Next == nil {
			f.mu.err = err
		}
		f.mu.Unlock()
		switch {
		case errors.Is(err, ErrFenced) && f.opts.Next != nil:
			if err := f.restart(f.stream); err != nil {
				return err
			}
			continue
		case errors.Is(err, ErrFenced), errors.Is(err, ErrInvalid):
			// Fenced, or a bug: a batch of checked, copied pages always encodes, and
			// is put again byte for byte.
			return err
		case f.ctx.Err() != nil:
			return ErrClosed
		}
		select {
		case <-f.opts.Clock.After(f.opts.Retry):
		case <-f.ctx.Done():
			return ErrClosed
		}
	}
}
