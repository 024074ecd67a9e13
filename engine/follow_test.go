package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// yielded is one step of a read: a record, or the error that ended it.
type yielded struct {
	shard.Record
	err error
}

// follow reads sh from offset from with Follow and sends what it yields on a
// channel, which it closes after the error that ends the read.
func follow(ctx context.Context, sh *shard.Shard, from uint64, opts ...shard.ReadOption) <-chan yielded {
	out := make(chan yielded, 1024)
	go func() {
		defer close(out)
		for rec, err := range sh.Read(ctx, from, append(opts, shard.Follow())...) {
			out <- yielded{rec, err}
			if err != nil {
				return
			}
		}
	}()
	return out
}

// TestAFollowingReadYieldsEveryRecordOnceAsItIsAcknowledged: a reader follows a
// shard from its start while four appenders write it and seals truncate its WAL
// under the reader; it sees every acknowledged record once, in offset order, and
// ends with its context's error when that ends.
func TestAFollowingReadYieldsEveryRecordOnceAsItIsAcknowledged(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir(), Seal: seal.Options{SizeBytes: 4 << 10, Interval: 5 * time.Millisecond}})
	sh := openShard(t, e, "s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := follow(ctx, sh, 0)

	const appenders, batches = 4, 100
	var mu sync.Mutex
	acked := map[uint64]string{}
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				rs := recs(fmt.Sprintf("a%d-b%d-%s", a, b, string(make([]byte, 64))), 3)
				first, err := sh.Append(context.Background(), rs...)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, r := range rs {
					acked[first+uint64(i)] = string(r)
				}
				mu.Unlock()
			}
		}()
	}
	total := uint64(appenders * batches * 3)
	deadline := time.After(30 * time.Second)
	for next := uint64(0); next < total; next++ {
		select {
		case rec := <-got:
			if rec.err != nil || rec.Offset != next {
				t.Fatalf("the follower got offset %d (%q, %v) where %d was due", rec.Offset, rec.Value, rec.err, next)
			}
			// An acknowledged record may reach the reader before its Append
			// returns; it must be the one that Append then reports.
			wg.Wait()
			mu.Lock()
			want := acked[next]
			mu.Unlock()
			if string(rec.Value) != want {
				t.Fatalf("the follower got %q at %d, the append there was %q", rec.Value, next, want)
			}
		case <-deadline:
			t.Fatalf("the follower got %d of %d records within 30 s", next, total)
		}
	}
	if info := sh.Info(); info.Sealed == 0 || info.Readable != total || info.Next != total {
		t.Fatalf("after the appends: %+v; want seals under the follower and Readable = Next = %d", info, total)
	}
	select {
	case rec := <-got:
		t.Fatalf("the follower got %d (%q) past the end", rec.Offset, rec.Value)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if rec, ok := <-got; !ok || !errors.Is(rec.err, context.Canceled) {
		t.Fatalf("after its context ended the follower got %v %+v", ok, rec)
	}
	if _, ok := <-got; ok {
		t.Fatal("the follower went on after its error")
	}
}

// TestAFollowingReadEndsWhenItsHandleCloses: a follower waiting at the end of a
// shard ends with ErrClosed when the shard closes, not at its context's end.
func TestAFollowingReadEndsWhenItsHandleCloses(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	appendBatches(t, sh, 2)
	var last error
	done := make(chan struct{})
	n := 0
	go func() {
		defer close(done)
		for _, err := range sh.Read(context.Background(), 0, shard.Follow()) {
			if err != nil {
				last = err
				return
			}
			n++
		}
	}()
	waitFor(t, 10*time.Second, "the follower reads the 8 records", func() bool { return sh.Info().Readable == 8 })
	time.Sleep(20 * time.Millisecond)
	if err := sh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not end when its shard closed")
	}
	if n != 8 || !errors.Is(last, shard.ErrClosed) {
		t.Fatalf("the follower read %d records and ended with %v, want 8 and ErrClosed", n, last)
	}
}

// TestAFollowingReadEndsWhenItsOwnerIsFenced: machine A follows x; machine B,
// whose clock is past A's lease, takes x over; A's next append meets B's fence,
// and A's follower ends with ErrFenced, having read only what A acknowledged.
func TestAFollowingReadEndsWhenItsOwnerIsFenced(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	clkA, clkB := testclock.New(), testclock.New()
	clkB.Advance(time.Minute)
	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clkA, Durability: Remote})
	eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: clkB, Durability: Remote})
	x := openShard(t, eA, "x")
	acked := appendBatches(t, x, 3)
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a liveness bound
	defer cancel()
	got := follow(fctx, x, 0)
	if _, err := eB.OpenShard(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Append(ctx, recs("late", 2)...); err == nil {
		t.Fatal("A's append after B's takeover was acknowledged")
	}
	var read int
	for rec := range got {
		if rec.err != nil {
			if !errors.Is(rec.err, manifest.ErrFenced) {
				t.Fatalf("A's follower ended with %v, want ErrFenced", rec.err)
			}
			break
		}
		read++
	}
	if read != len(acked) {
		t.Fatalf("A's follower read %d records, A acknowledged %d", read, len(acked))
	}
}

// TestBoundedReads: Until ends a read before an offset, across a part and the
// WAL; Limit after a count; with Follow, Until waits for the records it names and
// then ends without an error.
func TestBoundedReads(t *testing.T) {
	ctx := context.Background()
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	all := appendBatches(t, sh, 5) // 20 records
	if _, err := sh.Seal(ctx, 1<<40); err != nil {
		t.Fatal(err)
	}
	all = append(all, appendBatches(t, sh, 5)...) // 20 more in the WAL
	read := func(from uint64, opts ...shard.ReadOption) (first uint64, vals [][]byte) {
		first = ^uint64(0)
		for rec, err := range sh.Read(ctx, from, opts...) {
			if err != nil {
				t.Fatalf("read from %d: %v", from, err)
			}
			if first == ^uint64(0) {
				first = rec.Offset
			}
			vals = append(vals, rec.Value)
		}
		return first, vals
	}
	for _, c := range []struct {
		name     string
		from     uint64
		opts     []shard.ReadOption
		from_, n int
	}{
		{"until inside the part", 3, []shard.ReadOption{shard.Until(11)}, 3, 8},
		{"until across part and WAL", 15, []shard.ReadOption{shard.Until(25)}, 15, 10},
		{"until past the end", 30, []shard.ReadOption{shard.Until(100)}, 30, 10},
		{"until at from", 7, []shard.ReadOption{shard.Until(7)}, 0, 0},
		{"limit", 18, []shard.ReadOption{shard.Limit(4)}, 18, 4},
		{"limit and until", 18, []shard.ReadOption{shard.Limit(4), shard.Until(20)}, 18, 2},
		{"limit past the end", 38, []shard.ReadOption{shard.Limit(10)}, 38, 2},
	} {
		first, vals := read(c.from, c.opts...)
		if len(vals) != c.n || (c.n > 0 && (first != uint64(c.from_) || !equal(vals, all[c.from_:c.from_+c.n]))) {
			t.Errorf("%s: read %d records from %d, want %d from %d", c.name, len(vals), first, c.n, c.from_)
		}
	}
	// Following up to 44: the last four come after the read began.
	done := make(chan [][]byte)
	go func() { _, vals := read(38, shard.Until(44), shard.Follow()); done <- vals }()
	time.Sleep(20 * time.Millisecond)
	more := appendBatches(t, sh, 2)
	select {
	case vals := <-done:
		if !equal(vals, append(all[38:40:40], more[:4]...)) {
			t.Fatalf("following until 44 read %d records", len(vals))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a following read until 44 did not end once 44 was acknowledged")
	}
}
