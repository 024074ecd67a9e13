package wal

import (
	"context"
	"testing"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestTruncationForgetsTheGivenPagesItSealed: the log keeps, per shard, the pages
// it gave the tail (st.mu.given, for TailFrom), documented as "since the floor".
// TruncateThrough raises the floor (cutLocked) but never prunes that list; only
// an Import, a reset or the load at Open do (setFloorLocked). A shard that stays
// open keeps one entry, and its ticket, per append for as long as it is open:
// memory that grows with every append, and a TailFrom that walks all of it under
// the shard's lock at every seal.
//
// Expected: after a truncation through the end, no given page is below the floor.
func TestTruncationForgetsTheGivenPagesItSealed(t *testing.T) {
	ctx := context.Background()
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	f := tail.NewFlusher(tail.NewStream(substratetest.NewBucket(t, "b", mem.New()), "i", 1, 0, "w"), tail.FlushOptions{})
	defer f.Close(ctx)
	l.ShipTo(f, ShipOptions{})
	if err := l.SetEpoch("s", 1); err != nil {
		t.Fatal(err)
	}
	const pages = 100
	for i := range pages {
		if _, err := l.Append(ctx, "s", 1, recs("r", 1)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := l.TruncateThrough("s", 1, pages); err != nil {
		t.Fatal(err)
	}
	st := l.state("s")
	st.mu.Lock()
	n, floor := len(st.mu.given), st.mu.floor
	st.mu.Unlock()
	if n != 0 {
		t.Fatalf("after the truncation through %d (floor %d) the log still keeps %d given pages below the floor", pages, floor, n)
	}
}
