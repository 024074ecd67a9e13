package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// openReader opens a Reader on its own client of the shared bucket drv holds.
func openReader(t *testing.T, drv *mem.Driver) *Reader {
	t.Helper()
	r, err := OpenReader(context.Background(), ReaderOptions{Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 9)), Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// readerFollow reads id with r from offset from with Follow and sends what it
// yields on a channel, which it closes after the error that ends the read.
func readerFollow(ctx context.Context, r *Reader, id string, from uint64, opts ...shard.ReadOption) <-chan yielded {
	out := make(chan yielded, 1<<16)
	go func() {
		defer close(out)
		for rec, err := range r.Read(ctx, id, from, append(opts, shard.Follow())...) {
			out <- yielded{rec, err}
			if err != nil {
				return
			}
		}
	}()
	return out
}

// ackLog is what appends acknowledged: a value per offset, and the end.
type ackLog struct {
	mu    sync.Mutex
	acked map[uint64]string
	end   uint64
}

func (a *ackLog) append(t *testing.T, sh *shard.Shard, rs [][]byte) {
	t.Helper()
	first, err := sh.Append(context.Background(), rs...)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.acked == nil {
		a.acked = map[uint64]string{}
	}
	for i, r := range rs {
		a.acked[first+uint64(i)] = string(r)
	}
	a.end = max(a.end, first+uint64(len(rs)))
}

func (a *ackLog) snapshot() (map[uint64]string, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(map[uint64]string, len(a.acked))
	for k, v := range a.acked {
		m[k] = v
	}
	return m, a.end
}

// collect takes records from got, which must come at offsets next, next+1, …,
// until it has reached end, and returns them; it fails on an error or after bound.
func collect(t *testing.T, got <-chan yielded, next, end uint64, bound time.Duration) []shard.Record {
	t.Helper()
	var out []shard.Record
	deadline := time.After(bound)
	for next < end {
		select {
		case y, ok := <-got:
			if !ok {
				t.Fatalf("the read ended at %d, before %d", next, end)
			}
			if y.err != nil {
				t.Fatalf("the read ended at %d: %v", next, y.err)
			}
			if y.Offset != next {
				t.Fatalf("the reader returned offset %d where %d was due", y.Offset, next)
			}
			out = append(out, y.Record)
			next++
		case <-deadline:
			t.Fatalf("the reader reached %d of %d within %s", next, end, bound)
		}
	}
	return out
}

// checkAgainst fails unless every record the reader returned is the one acks
// holds at its offset.
func checkAgainst(t *testing.T, who string, got []shard.Record, acked map[uint64]string) {
	t.Helper()
	for _, r := range got {
		if want, ok := acked[r.Offset]; !ok || want != string(r.Value) {
			t.Fatalf("%s: the reader returned %q at %d, the acknowledged record there is %q (%v)", who, r.Value, r.Offset, want, ok)
		}
	}
}

// TestAReaderFollowsAShardWhileItsOwnerAppends: a Reader on machine R, without a
// lease, follows shard x while machine A appends to it from two goroutines and
// seals it now and then. It returns every acknowledged record once, in order,
// each the one acknowledged at its offset, and reaches the last within a bound
// after it was acknowledged.
func TestAReaderFollowsAShardWhileItsOwnerAppends(t *testing.T) {
	for _, d := range []Durability{Remote, Local} {
		t.Run(d.String(), func(t *testing.T) {
			drv := mem.New()
			eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 1)), Durability: d,
				Seal: seal.Options{SizeBytes: 16 << 10, Interval: 20 * time.Millisecond}})
			x := openShard(t, eA, "x")
			r := openReader(t, drv)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := readerFollow(ctx, r, "x", 0)

			var acks ackLog
			var wg sync.WaitGroup
			for a := range 2 {
				wg.Go(func() {
					for b := range 60 {
						acks.append(t, x, recs(fmt.Sprintf("a%d-b%d-%s", a, b, make([]byte, 100)), 3))
					}
				})
			}
			wg.Wait()
			acked, end := acks.snapshot()
			start := time.Now()
			read := collect(t, got, 0, end, 10*time.Second)
			t.Logf("the reader reached the last acknowledged record %s after it was acknowledged", time.Since(start))
			checkAgainst(t, "A", read, acked)
			select {
			case y := <-got:
				t.Fatalf("the reader returned more than was appended: %+v", y)
			case <-time.After(200 * time.Millisecond):
			}
		})
	}
}

// TestAReaderFollowsAShardAcrossThreeOwners: machine A appends to x and retires
// it; machine B opens it and appends; then B is lost (its client fails every call
// from then on) and machine C, whose clock is past B's lease, takes x over and
// appends. A Reader following x from the start returns every acknowledged
// record of the three once, in order: A's from the tail and then the parts, B's
// from B's tail and then C's history, C's from C's.
func TestAReaderFollowsAShardAcrossThreeOwners(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa, fb := fault.Wrap(drv, 1), fault.Wrap(drv, 2)
	clk, clkC := testclock.New(), testclock.New()
	clkC.Advance(time.Minute)
	mk := func(f *fault.Driver, c *testclock.Clock) Options {
		return Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", f), Seal: quietSealOptions(), Clock: c}
	}
	r := openReader(t, drv)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := readerFollow(rctx, r, "x", 0)
	var acks ackLog

	eA := open(t, mk(fa, clk))
	xA := openShard(t, eA, "x")
	for b := range 10 {
		acks.append(t, xA, recs(fmt.Sprintf("A-b%d", b), 4))
	}
	_, end := acks.snapshot()
	read := collect(t, got, 0, end, 10*time.Second)
	if err := xA.Retire(ctx); err != nil {
		t.Fatal(err)
	}

	eB := open(t, mk(fb, clk))
	xB := openShard(t, eB, "x")
	for b := range 10 {
		acks.append(t, xB, recs(fmt.Sprintf("B-b%d", b), 4))
	}
	next := end
	_, end = acks.snapshot()
	read = append(read, collect(t, got, next, end, 10*time.Second)...)
	// B is lost: its client calls no more, and its engine never closes cleanly.
	fb.SetRules(fault.Rule{Err: errMachineDown, Last: true})
	t.Cleanup(func() {
		closed := make(chan error, 1)
		go func() { closed <- eB.Close() }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
		}
	})

	eC := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 3)), Seal: quietSealOptions(), Clock: clkC})
	octx, ocancel := context.WithTimeout(ctx, 20*time.Second)
	defer ocancel()
	xC, err := eC.OpenShard(octx, "x", WaitForLease())
	if err != nil {
		t.Fatal(err)
	}
	for b := range 10 {
		acks.append(t, xC, recs(fmt.Sprintf("C-b%d", b), 4))
	}
	next = end
	acked, end := acks.snapshot()
	read = append(read, collect(t, got, next, end, 10*time.Second)...)
	checkAgainst(t, "A, B and C", read, acked)
	if history := readAll(t, xC, 0); uint64(len(history)) != end {
		t.Fatalf("C holds %d records, %d were acknowledged", len(history), end)
	}
}

// TestAReaderRacingSealsAndCollectionNeverErrsNorRepeats: A seals x every few
// KiB and collects its tail objects soon after, while a Reader follows x: the
// reader meets parts and tail objects removed under it, and still returns every
// record once, in order, without an error.
func TestAReaderRacingSealsAndCollectionNeverErrsNorRepeats(t *testing.T) {
	drv := mem.New()
	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 1)),
		Seal: seal.Options{SizeBytes: 2 << 10, Interval: 5 * time.Millisecond},
		Tail: TailOptions{CollectEvery: 10 * time.Millisecond, CollectAfter: 20 * time.Millisecond}})
	x := openShard(t, eA, "x")
	r := openReader(t, drv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var readers []<-chan yielded
	for range 3 {
		readers = append(readers, readerFollow(ctx, r, "x", 0))
	}
	var acks ackLog
	for b := range 150 {
		acks.append(t, x, recs(fmt.Sprintf("b%d-%s", b, make([]byte, 80)), 2))
	}
	acked, end := acks.snapshot()
	for i, got := range readers {
		checkAgainst(t, fmt.Sprint("reader ", i), collect(t, got, 0, end, 20*time.Second), acked)
	}
	if counts(eA).seals < 5 {
		t.Fatalf("only %d seals: the test did not race any", counts(eA).seals)
	}
}

// TestAReaderOfAShardNeverWrittenReadsNothing, and the bounds: Until and Limit end
// a read, with and without Follow.
func TestAReaderOfAShardNeverWrittenReadsNothing(t *testing.T) {
	drv := mem.New()
	r := openReader(t, drv)
	ctx := context.Background()
	for rec, err := range r.Read(ctx, "nothing", 0) {
		t.Fatalf("a shard never written yields %+v, %v", rec, err)
	}
	fctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	var ended error
	for rec, err := range r.Read(fctx, "nothing", 0, shard.Follow()) {
		if err == nil {
			t.Fatalf("a following read of a shard never written yields %+v", rec)
		}
		ended = err
	}
	if !errors.Is(ended, context.DeadlineExceeded) {
		t.Fatalf("a following read of a shard never written ended with %v, want its context's error", ended)
	}

	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 1)), Seal: quietSealOptions()})
	x := openShard(t, eA, "x")
	all := appendBatches(t, x, 3) // 12 records
	read := func(from uint64, opts ...shard.ReadOption) []string {
		var out []string
		for rec, err := range r.Read(ctx, "x", from, opts...) {
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(rec.Value))
		}
		return out
	}
	if got := read(0); len(got) != 12 || got[11] != string(all[11]) {
		t.Fatalf("read from 0: %q", got)
	}
	if got := read(2, shard.Until(5)); len(got) != 3 || got[0] != string(all[2]) {
		t.Fatalf("read [2,5): %q", got)
	}
	if got := read(3, shard.Limit(4)); len(got) != 4 || got[3] != string(all[6]) {
		t.Fatalf("read 4 from 3: %q", got)
	}
	if got := read(20); len(got) != 0 {
		t.Fatalf("read from past the end: %q", got)
	}
	if got := read(5, shard.Until(5)); len(got) != 0 {
		t.Fatalf("read [5,5): %q", got)
	}
	// Follow with Until waits for the records below it, and ends there.
	done := make(chan []string, 1)
	go func() { done <- read(10, shard.Until(14), shard.Follow()) }()
	more := appendBatches(t, x, 1)
	select {
	case got := <-done:
		if len(got) != 4 || got[3] != string(more[1]) {
			t.Fatalf("follow [10,14): %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a following read until 14 did not end once 14 records were appended")
	}
	if _, err := x.Seal(ctx, 1<<20); err != nil {
		t.Fatal(err)
	}
	if got := read(1, shard.Limit(20)); len(got) != 15 || got[14] != string(more[3]) {
		t.Fatalf("read from the parts: %q", got)
	}
}
