package wal

import (
	"context"
	"fmt"
	"sort"
)

// A Sink takes a log's pages as they are appended, to ship them elsewhere (to an
// object store, where another machine can read them). The log knows nothing of
// where they go: it hands each page over, and in Remote mode waits for its
// Shipment before acknowledging it.
type Sink interface {
	// Take takes one page of shard, appended under epoch, whose records have
	// offsets from first on. The log calls it under the shard's lock, so a
	// shard's pages come in offset order; it must copy recs and not block.
	Take(shard string, epoch, first uint64, recs [][]byte) Shipment
	// Room waits, before a page enters the log (without ShipOptions.Remote),
	// until the sink has room for it, or ctx ends.
	Room(ctx context.Context) error
	// Gather holds shipping back until done is called, so that pages taken
	// meanwhile go out together.
	Gather() (done func())
}

// A Shipment is one page a Sink took.
type Shipment interface {
	// Wait returns nil once the page is shipped, with every page of its shard
	// taken before it, or the reason it will not be; or ctx's error.
	Wait(ctx context.Context) error
}

// ShipOptions say how appends wait for the sink.
type ShipOptions struct {
	// Remote makes Append return only once its page is shipped as well as
	// synced; reads see a page only then. Without it an append waits for the
	// sink's Room before it enters the log.
	Remote bool
}

// ShipTo makes the log hand every page appended from now on to s, with appends
// waiting for it as opts say. Call it once, before the first append.
func (l *Log) ShipTo(s Sink, opts ShipOptions) {
	l.ship = opts
	l.sink = s
}

// waitRoom holds an append back, in Local mode, while the sink has no room.
func (l *Log) waitRoom(ctx context.Context) error {
	if l.ship.Remote || l.sink == nil {
		return nil
	}
	if err := l.sink.Room(ctx); err != nil {
		return fmt.Errorf("wal: waiting for the sink: %w", err)
	}
	return nil
}

// Reship hands the sink every page of the shard from offset from on again, under
// epoch, in one step under the shard's lock, so that no page appended meanwhile
// can reach it out of order, or be missed. It returns the shipment of the last
// page (nil without pages).
func (l *Log) Reship(shard string, epoch, from uint64) (Shipment, error) {
	if err := l.enter(); err != nil {
		return nil, err
	}
	defer l.exit()
	if l.sink == nil {
		return nil, nil
	}
	st := l.state(shard)
	defer l.sink.Gather()() // the backlog goes out in as few objects as it fits
	st.mu.Lock()
	defer st.mu.Unlock()
	n := len(st.mu.pages)
	if n == 0 || from >= st.mu.next {
		return nil, nil
	}
	// Every page added so far, synced or not, under the lock that appends take to
	// add theirs: wait for the last one's group to be on disk, to read them.
	if err := st.mu.pages[n-1].g.wait(); err != nil {
		return nil, l.fail("sync", err)
	}
	pages := st.mu.pages
	refs := pages[sort.Search(n, func(i int) bool { return pages[i].next() > from }):]
	pinned := l.w.pin(refs)
	defer l.w.unpin(pinned)
	var (
		buf  []byte
		last Shipment
	)
	for _, r := range refs {
		p, err := l.readPage(shard, r, &buf)
		if err != nil {
			return nil, err
		}
		last = l.sink.Take(shard, epoch, p.FirstOffset, p.Records) // it copies: buf is reused
	}
	return last, nil
}
