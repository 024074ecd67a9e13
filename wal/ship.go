package wal

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/l0store/l0/internal/tail"
)

// ShipOptions say how appends wait for the tail.
type ShipOptions struct {
	// Remote makes Append return only once its page is shipped as well as synced;
	// reads see a page only then.
	Remote bool
	// MaxBytes and MaxAge bound, without Remote, what the tail has been given and
	// not shipped: an append waits, before it enters the log, while the pending
	// pages hold MaxBytes or the oldest is MaxAge old. Zero is no bound.
	MaxBytes int
	MaxAge   time.Duration
}

// ShipTo makes the log give every page appended from now on to f, which ships it to
// the object store, with appends waiting for it as opts say. Call it once, before
// the first append.
func (l *Log) ShipTo(f *tail.Flusher, opts ShipOptions) {
	l.ship = opts
	l.tail.Store(f)
}

// ShipNewShardsTo makes f the flusher of the shards the log has not seen yet;
// Reship moves a shard it has seen.
func (l *Log) ShipNewShardsTo(f *tail.Flusher) { l.tail.Store(f) }

// waitRoom holds an append back, in Local mode, while the shard's tail holds as
// much unshipped as the options allow.
func (l *Log) waitRoom(ctx context.Context, st *shardState) error {
	if l.ship.Remote {
		return nil
	}
	st.mu.Lock()
	f := st.mu.tail
	st.mu.Unlock()
	if f == nil {
		return nil
	}
	if err := f.WaitRoom(ctx, l.ship.MaxBytes, l.ship.MaxAge); err != nil {
		return fmt.Errorf("wal: waiting for the tail: %w", err)
	}
	return nil
}

// WaitShipped waits until every page of the shard given to the tail is shipped,
// and returns where the shard's pages end in its tail stream: the stream's
// incarnation, and a sequence past every object that holds one. It returns the
// error of the last page if that failed.
func (l *Log) WaitShipped(ctx context.Context, shard string) (incarnation, until uint64, err error) {
	st := l.state(shard)
	st.mu.Lock()
	t, f := st.mu.shipping, st.mu.tail
	st.mu.Unlock()
	if t != nil {
		if err := t.Wait(ctx); err != nil {
			return 0, 0, err
		}
	}
	if f == nil {
		return 0, 0, nil
	}
	return f.Incarnation(), f.Next(), nil
}

// Reship gives f every page of the shard from offset from on, under epoch, and
// makes f the shard's tail from then on, in one step under the shard's lock: no
// page can reach f out of order, or be missed. It returns the ticket of the last
// page (nil without pages). With hold, the pages appended from now on are not
// acknowledged until Resume opens the shard again: its owner must first point
// the shard's manifest at f's stream.
func (l *Log) Reship(shard string, epoch, from uint64, f *tail.Flusher, hold bool) (*tail.Ticket, error) {
	if err := l.enter(); err != nil {
		return nil, err
	}
	defer l.exit()
	st := l.state(shard)
	defer f.Gather()() // the backlog goes out in as few objects as it fits
	st.mu.Lock()
	defer st.mu.Unlock()
	var (
		last  *tail.Ticket
		given []givenPage
	)
	if n := len(st.mu.pages); n > 0 && from < st.mu.next {
		// Every page added so far, synced or not, under the lock that appends take
		// to add theirs: wait for the last one's group to be on disk, to read them.
		if err := st.mu.pages[n-1].g.wait(); err != nil {
			return nil, l.fail("sync", err)
		}
		pages := st.mu.pages
		refs := pages[sort.Search(n, func(i int) bool { return pages[i].next() > from }):]
		pinned := l.w.pin(refs)
		defer l.w.unpin(pinned)
		var buf []byte
		for _, r := range refs {
			p, err := l.readPage(shard, r, &buf)
			if err != nil {
				return nil, err
			}
			// The tail copies the records: buf is reused.
			last = f.Add(shard, epoch, p.FirstOffset, p.Records)
			given = append(given, givenPage{p.FirstOffset, last})
		}
	}
	st.mu.tail, st.mu.shipErr, st.mu.given = f, nil, given
	if last != nil {
		st.mu.shipping = last
	}
	if hold && st.mu.gate == nil { // a gate already set is kept: its waiters wait on it
		st.mu.gate = &gate{open: make(chan struct{})}
	}
	return last, nil
}

// Resume opens a shard that Reship held: with a nil err its held pages are
// acknowledged; otherwise they fail with err, and so does every later append.
func (l *Log) Resume(shard string, err error) {
	st := l.state(shard)
	st.mu.Lock()
	defer st.mu.Unlock()
	if g := st.mu.gate; g != nil {
		g.err = err
		close(g.open)
		st.mu.gate = nil
	}
	if err != nil {
		st.mu.shipErr = err
	}
}

// gate holds acknowledgements back until it opens.
type gate struct {
	open chan struct{}
	err  error // set before open closes
}

// wait waits for g to open; a nil gate is open.
func (g *gate) wait(ctx context.Context) error {
	if g == nil {
		return nil
	}
	select {
	case <-g.open:
		return g.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// givenPage is a page given to the shard's tail, by its first offset.
type givenPage struct {
	first uint64
	t     *tail.Ticket
}

// TailFrom returns the shard's tail stream (its incarnation) and a sequence at or
// below that of every object that holds, or will hold, a page of the shard with
// offsets from offset on: the sequence a manifest's tail pointer can advance to
// once everything before offset is sealed. ok is false if no such sequence is
// known (a page there whose shipment failed).
func (l *Log) TailFrom(shard string, offset uint64) (incarnation, seq uint64, ok bool) {
	st := l.state(shard)
	st.mu.Lock()
	defer st.mu.Unlock()
	f := st.mu.tail
	if f == nil {
		return 0, 0, false
	}
	// Pages given from now on go at or after f.Next(); of those given already, the
	// first at or past offset bounds the rest, which follow it.
	seq = f.Next()
	for _, g := range st.mu.given {
		if g.first < offset {
			continue
		}
		// Its object's sequence, or f.Next() if it is not shipped yet: read
		// together, under the flusher's lock.
		s, ok := f.Bound(g.t)
		if !ok {
			return 0, 0, false
		}
		seq = min(seq, s)
		break
	}
	return f.Incarnation(), seq, true
}
