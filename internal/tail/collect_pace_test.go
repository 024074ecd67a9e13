package tail

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
)

// TestCollectionDeletesEveryObjectOldEnoughInOnePass: CollectAfter is how long an
// object must have been seen (listed by a pass) before it goes. A pass lists
// every object of the stream, so one pass at least After after the first must
// delete all those it listed that no shard needs.
//
// A pass stops at the first object it has not seen before, and records as seen
// only the objects it looked at: every later object is seen by a later pass, one
// more per pass. With the defaults (a pass a minute, After five minutes) a stream
// loses one object every five minutes, however many its writer puts (up to 20 a
// second), and the tail grows without bound.
func TestCollectionDeletesEveryObjectOldEnoughInOnePass(t *testing.T) {
	ctx := t.Context()
	b := bucket(t)
	if _, err := Begin(ctx, b, "dead", 1); err != nil {
		t.Fatal(err)
	}
	w := NewStream(b, "dead", 1, 0, "w")
	const n = 10
	for i := range n {
		if _, err := w.Put(ctx, []Section{{Shard: "s", Epoch: 1, First: uint64(i), Records: records(1, "x")}}); err != nil {
			t.Fatal(err)
		}
	}
	clk := testclock.New()
	collector := Open(Options{
		Bucket: b, Instance: "survivor",
		NextIncarnation: func(after uint64) (uint64, error) { return after + 1, nil },
		Flush:           FlushOptions{Clock: clk},
		Collect: CollectOptions{
			After: time.Minute,
			View:  func(context.Context, string) (View, error) { return View{Epoch: 2, Sealed: n}, nil }, // sealed by another owner
			Dead:  func(context.Context) ([]string, error) { return []string{"dead"}, nil },
		},
	})
	defer collector.Close(ctx)
	if _, err := collector.CollectOnce(ctx); err != nil { // lists the stream: every object seen now
		t.Fatal(err)
	}
	clk.Advance(time.Minute + time.Second)
	deleted, err := collector.CollectOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if deleted != n {
		t.Fatalf("a pass a minute after the first, which listed all %d unneeded objects, deleted %d of them (%d tail objects left)", n, deleted, objects(t, b))
	}
}
