package tail

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// objects counts the tail objects on b.
func objects(t *testing.T, b *substrate.Bucket) int {
	t.Helper()
	n := 0
	for _, err := range b.ListAll(t.Context(), "tail/") {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

func wait(t *testing.T, tickets ...*Ticket) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, tk := range tickets {
		if err := tk.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOneObjectPerFlushWhateverTheNumberOfShards: pages that keep coming, from 1
// or from 256 shards, go out in one object per interval, and each shard reads back
// its own.
func TestOneObjectPerFlushWhateverTheNumberOfShards(t *testing.T) {
	const interval, window, tick = 50 * time.Millisecond, time.Second, 10 * time.Millisecond
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		puts := map[int]uint64{}
		for _, shards := range []int{1, 256} {
			b := newBucket(nil)
			f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: interval})
			var tickets []*Ticket
			start, rounds := time.Now(), 0
			for ; time.Since(start) < window; rounds++ {
				for s := range shards {
					tickets = append(tickets, f.Add(fmt.Sprint("shard-", s), 1, uint64(rounds), records(1, fmt.Sprint(s, "-", rounds))))
				}
				time.Sleep(tick)
			}
			wait(t, tickets...)
			elapsed := time.Since(start)
			puts[shards] = f.Stats().Puts
			if most := uint64(elapsed/interval) + 2; puts[shards] > most {
				t.Fatalf("%d shards: %d puts in %s, more than one per %s", shards, puts[shards], elapsed, interval)
			}
			for _, s := range []int{0, shards - 1} {
				got, err := ReadShard(t.Context(), b, "i-1", 0, 0, NoFence, fmt.Sprint("shard-", s))
				n := 0
				for _, sec := range got {
					n += len(sec.Records)
				}
				if err != nil || n != rounds {
					t.Fatalf("shard %d: %d records, %v", s, n, err)
				}
			}
			if err := f.Close(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if d := float64(puts[256]) / float64(puts[1]); d < 0.8 || d > 1.2 {
			t.Fatalf("puts: %d with 1 shard, %d with 256", puts[1], puts[256])
		}
	})
}

func TestAnIdleFlusherWritesNothing(t *testing.T) {
	b := bucket(t)
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: 10 * time.Millisecond})
	time.Sleep(100 * time.Millisecond)
	if err := f.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, puts := objects(t, b), f.Stats().Puts; n != 0 || puts != 0 {
		t.Fatalf("%d objects, %d puts", n, puts)
	}
}

// TestAFullBatchFlushesAtOnce: past Bytes, a flush does not wait for the interval.
func TestAFullBatchFlushesAtOnce(t *testing.T) {
	b := bucket(t)
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: time.Hour, Bytes: 64})
	defer f.Close(t.Context())
	wait(t, f.Add("a", 1, 0, records(1, "first"))) // the first flush starts at once
	big := [][]byte{make([]byte, 100)}
	wait(t, f.Add("a", 1, 1, big))
	if puts := f.Stats().Puts; puts != 2 {
		t.Fatalf("%d puts", puts)
	}
}

// TestAPageUnderANewEpochGoesInTheNextObject: an object holds one section per shard.
func TestAPageUnderANewEpochGoesInTheNextObject(t *testing.T) {
	b := bucket(t)
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: 100 * time.Millisecond})
	defer f.Close(t.Context())
	t1, t2 := f.Add("a", 1, 0, records(2, "old")), f.Add("a", 2, 2, records(1, "new"))
	wait(t, t1, t2)
	got, err := ReadShard(t.Context(), b, "i-1", 0, 0, NoFence, "a")
	if err != nil || len(got) != 2 || got[0].Epoch != 1 || got[1].Epoch != 2 || got[1].First != 2 {
		t.Fatalf("%+v %v", got, err)
	}
}

// TestAFlushWhoseReplyWasLostIsShippedOnce: the put landed, the flusher was told it
// failed; it puts the same object again and the page is acknowledged, once.
func TestAFlushWhoseReplyWasLostIsShippedOnce(t *testing.T) {
	b := bucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 1, Err: fault.ErrInjected, Ambiguous: true})
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Retry: time.Millisecond})
	defer f.Close(t.Context())
	wait(t, f.Add("a", 1, 0, records(3, "r")))
	wait(t, f.Add("a", 1, 3, records(1, "s")))
	st := f.Stats()
	got, err := ReadShard(t.Context(), b, "i-1", 0, 0, NoFence, "a")
	if err != nil || len(got) != 2 || got[0].Sequence != 0 || got[1].First != 3 || st.Failures != 1 || st.Puts != 2 {
		t.Fatalf("%+v %+v %v", st, got, err)
	}
}

// TestAFencedFlusherAcknowledgesNothingMore: once its stream is fenced, nothing given
// to the flusher is acknowledged.
func TestAFencedFlusherAcknowledgesNothingMore(t *testing.T) {
	b := bucket(t)
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: time.Millisecond})
	defer f.Close(t.Context())
	wait(t, f.Add("a", 1, 0, records(1, "before")))
	if _, _, err := Fence(t.Context(), b, "i-1", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Add("a", 1, 1, records(1, "after")).Wait(t.Context()); !errors.Is(err, ErrFenced) {
		t.Fatalf("a page after the fence: %v", err)
	}
	if err := f.Add("a", 1, 2, records(1, "later")).Wait(t.Context()); !errors.Is(err, ErrFenced) {
		t.Fatalf("a page given once fenced: %v", err)
	}
}

// TestCloseShipsWhatItWasGivenOrGivesUpWithItsContext.
func TestCloseShipsWhatItWasGivenOrGivesUpWithItsContext(t *testing.T) {
	b := bucket(t)
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: time.Hour})
	wait(t, f.Add("a", 1, 0, records(1, "x")))
	tk := f.Add("a", 1, 1, records(1, "y")) // waits for the interval
	if err := f.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := tk.Wait(t.Context()); err != nil {
		t.Fatalf("a page given before Close: %v", err)
	}
	if err := f.Add("a", 1, 2, records(1, "z")).Wait(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a page given after Close: %v", err)
	}

	down := bucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Err: fault.ErrInjected})
	f = NewFlusher(NewStream(down, "i-1", 0, 0, "w"), FlushOptions{Retry: time.Millisecond})
	tk = f.Add("a", 1, 0, records(1, "x"))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := f.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with the store down: %v", err)
	}
	if err := tk.Wait(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a page never shipped: %v", err)
	}
}

// bucket is an in-memory bucket, its driver disturbed by rules.
func bucket(t *testing.T, rules ...fault.Rule) *substrate.Bucket {
	t.Helper()
	var d substrate.Driver = mem.New()
	if len(rules) > 0 {
		d = fault.Wrap(d, 1, rules...)
	}
	b, err := substrate.New(d, substrate.Options{Name: "tail"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestPagesGatheredGoOutTogether: pages given under Gather go in one object, where
// without it the first would go out at once alone and the rest an interval later.
func TestPagesGatheredGoOutTogether(t *testing.T) {
	b := bucket(t)
	f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: time.Hour})
	defer f.Close(t.Context())
	done := f.Gather()
	var last *Ticket
	for i := range 100 {
		last = f.Add("a", 1, uint64(i), records(1, fmt.Sprint("page ", i)))
		time.Sleep(100 * time.Microsecond) // time for a flush to start, were it allowed
	}
	done()
	wait(t, last)
	if puts := f.Stats().Puts; puts != 1 {
		t.Fatalf("%d puts for 100 pages gathered, want 1", puts)
	}
}
