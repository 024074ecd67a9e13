package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// tailPuts counts the put-if-absent calls on tail objects over window while
// appenders goroutines append to shards shards, round robin, as fast as they can.
func tailPuts(t *testing.T, be backend, shards, appenders int, window time.Duration) (puts uint64, appends int) {
	t.Helper()
	bucket, _ := newBucket(t, be)
	e := open(t, Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()})
	opened := make([]*shard.Shard, shards)
	for i := range opened {
		opened[i] = openShard(t, e, fmt.Sprintf("s-%03d", i))
	}
	before := e.Metrics().TailPuts
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	for g := range appenders {
		wg.Go(func() {
			for i := g; ctx.Err() == nil; i += appenders {
				sh := opened[i%shards]
				if _, err := sh.Append(context.Background(), []byte("record")); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				appends++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return e.Metrics().TailPuts - before, appends
}

// TestOneTailObjectPerFlushWhateverTheNumberOfShards: the tail ships every busy
// shard's pages in one object per flush interval, so its puts do not grow with the
// number of shards: one busy shard and 256 busy shards cost the same puts.
func TestOneTailObjectPerFlushWhateverTheNumberOfShards(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		const window = 2 * time.Second
		one, n1 := tailPuts(t, be, 1, 256, window)
		many, n256 := tailPuts(t, be, 256, 256, window)
		t.Logf("tail puts over %s: %d with 1 busy shard (%d appends), %d with 256 (%d appends)", window, one, n1, many, n256)
		if one == 0 || many == 0 {
			t.Fatal("no tail puts")
		}
		if lo, hi := min(one, many), max(one, many); float64(hi-lo) > 0.2*float64(lo) {
			t.Fatalf("%d tail puts with 1 shard, %d with 256: more than 20%% apart", one, many)
		}
	})
}

// TestAnIdleEngineWritesNoTailObjects: once every page is shipped, an engine with
// shards open and nothing to append puts no tail object.
func TestAnIdleEngineWritesNoTailObjects(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		bucket, _ := newBucket(t, be)
		e := open(t, Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()})
		for i := range 20 {
			sh := openShard(t, e, fmt.Sprintf("s-%03d", i))
			if _, err := sh.Append(context.Background(), []byte("one")); err != nil {
				t.Fatal(err)
			}
		}
		puts := func() uint64 { return bucket.Stats().Total(substrate.OpPutIfAbsent) }
		before, shipped := puts(), e.Metrics().TailPuts
		time.Sleep(time.Second) // twenty flush intervals
		if n := puts() - before; n != 0 {
			t.Fatalf("an idle engine made %d puts in a second", n)
		}
		if n := e.Metrics().TailPuts - shipped; n != 0 {
			t.Fatalf("an idle engine shipped %d tail objects in a second", n)
		}
	})
}

// tailObjects lists the data objects and the fences under tail/ on b.
func tailObjects(t *testing.T, b *substrate.Bucket) (data, fences []string) {
	t.Helper()
	for e, err := range b.ListAll(context.Background(), "tail/") {
		if err != nil {
			t.Fatal(err)
		}
		if e.Size == 0 {
			fences = append(fences, e.Key)
		} else {
			data = append(data, e.Key)
		}
	}
	return data, fences
}

// collecting is options under which the tail is collected at once.
func collecting(b *substrate.Bucket) Options {
	return Options{Bucket: b, Seal: quietSealOptions(), Tail: TailOptions{CollectEvery: 20 * time.Millisecond, CollectAfter: 50 * time.Millisecond}}
}

// TestTailObjectsAreCollectedOnceSealed: machine A appends to shards a and b over
// many flushes. Once a is sealed the objects holding only a's records could go, but
// those holding b's unsealed records stay, and so does everything after them; b
// still moves to machine B with every record. Once the move seals b too, A's stream
// is collected down to its last object (a live stream keeps it).
func TestTailObjectsAreCollectedOnceSealed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		drvA, drvB := be.newPair(t)
		bucket := substratetest.NewBucket(t, "m", drvA)
		optsA := collecting(bucket)
		optsA.Dir = t.TempDir()
		eA := open(t, optsA)
		a, b := openShard(t, eA, "a"), openShard(t, eA, "b")
		wantB := appendBatches(t, b, 3)
		appendBatches(t, a, 10)
		if _, err := a.Seal(ctx, 1<<40); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // many collection passes
		data, _ := tailObjects(t, bucket)
		if len(data) < 10 {
			t.Fatalf("%d tail objects left while b's first records are unsealed, want them all (13 flushes)", len(data))
		}
		if err := b.Retire(ctx); err != nil {
			t.Fatal(err)
		}
		optsB := collecting(substratetest.NewBucket(t, "m", drvB))
		optsB.Dir = t.TempDir()
		eB := open(t, optsB)
		bB := openShard(t, eB, "b")
		if got := readAll(t, bB, 0); !equal(got, wantB) {
			t.Fatalf("b read back %q on machine B after collection passes, want %q", got, wantB)
		}
		waitFor(t, 5*time.Second, "b's backlog sealed on B", func() bool { return bB.Info().Sealed == uint64(len(wantB)) })
		// A liveness bound only: under a loaded -race run, passes every 20 ms
		// can take seconds.
		var left []string
		logged := -1
		waitFor(t, 30*time.Second, "A's stream collected to its last object", func() bool {
			left = left[:0]
			for e, err := range bucket.ListAll(ctx, "tail/"+eA.Instance()+"/") {
				if err != nil {
					t.Fatal(err)
				}
				if e.Size > 0 {
					left = append(left, e.Key)
				}
			}
			if len(left) != 1 && len(left) != logged {
				t.Logf("A's data objects left: %v", left)
				logged = len(left)
			}
			return len(left) == 1
		})
		// Everything but the last object, of at least A's objects listed before
		// the move (13 flushes may merge into as few as 10). A pass counts what
		// it deleted once it ends, after the listing above may have seen it.
		var listed int // A's objects before the move
		for _, k := range data {
			if strings.HasPrefix(k, "tail/"+eA.Instance()+"/") {
				listed++
			}
		}
		waitFor(t, 5*time.Second, "A's collection counted", func() bool {
			return eA.Metrics().TailObjectsCollected >= uint64(listed-1)
		})
	})
}

// TestAFenceIsNeverCollected: B takes shard s over from A after A's lease ran out
// (by B's clock), fencing A's stream, and seals everything; A meets the fence with
// an append to another shard and moves to a new incarnation. A's collection then
// deletes the fenced stream's objects, all superseded, but never its fence.
func TestAFenceIsNeverCollected(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		drvA, drvB := be.newPair(t)
		clkA, clkB := testclock.New(), testclock.New()
		optsA := collecting(substratetest.NewBucket(t, "m", drvA))
		// A learns at its next renewal that it was fenced; until then its own view of
		// the manifest keeps its objects.
		optsA.Dir, optsA.Clock, optsA.RenewEvery = t.TempDir(), clkA, 100*time.Millisecond
		optsB := collecting(substratetest.NewBucket(t, "m", drvB))
		optsB.Dir, optsB.Clock = t.TempDir(), clkB
		eA, eB := open(t, optsA), open(t, optsB)
		want := appendBatches(t, openShard(t, eA, "s"), 5)
		other := openShard(t, eA, "other")
		clkB.Advance(eB.opts.Lease.Duration + eB.opts.Lease.SkewMargin + time.Second)
		sB := openShard(t, eB, "s")
		waitFor(t, 5*time.Second, "the backlog sealed on B", func() bool { return sB.Info().Sealed == uint64(len(want)) })
		if err := sB.Close(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "A's other shard carrying on in a new incarnation", func() bool {
			_, err := other.Append(ctx, []byte("after the fence"))
			return err == nil
		})
		fenced := fmt.Sprintf("tail/%s/%020d/", eA.Instance(), 1)
		waitFor(t, 5*time.Second, "A's fenced stream collected", func() bool {
			clkA.Advance(10 * time.Millisecond) // A's objects age past CollectAfter
			data, _ := tailObjects(t, eA.set.Authority().Bucket)
			for _, k := range data {
				if strings.HasPrefix(k, fenced) {
					return false
				}
			}
			return true
		})
		time.Sleep(200 * time.Millisecond) // more passes
		_, fences := tailObjects(t, eA.set.Authority().Bucket)
		if !slices.ContainsFunc(fences, func(k string) bool { return strings.HasPrefix(k, fenced) }) {
			t.Fatalf("the fence on %s was collected: fences left %q", fenced, fences)
		}
	})
}

// TestASealAdvancesTheTailPointer: a seal commit moves the shard's tail pointer
// past the objects that hold only sealed records, so a takeover reads from there;
// the records past the seal still move with the shard.
func TestASealAdvancesTheTailPointer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be backend) {
		ctx := context.Background()
		drvA, drvB := be.newPair(t)
		e := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "m", drvA), Seal: quietSealOptions()})
		sh := openShard(t, e, "s")
		appendBatches(t, sh, 10)
		from := sh.Manifest().Tail.From
		if _, err := sh.Seal(ctx, 1<<40); err != nil {
			t.Fatal(err)
		}
		after := sh.Manifest().Tail.From
		if after < from+10 {
			t.Fatalf("tail pointer at %d after sealing 10 flushes' records, %d before", after, from)
		}
		var want [][]byte
		for rec, err := range sh.Read(ctx, 0) {
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, rec.Value)
		}
		want = append(want, appendBatches(t, sh, 2)...)
		if err := sh.Retire(ctx); err != nil {
			t.Fatal(err)
		}
		eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "m", drvB), Seal: quietSealOptions()})
		if got := readAll(t, openShard(t, eB, "s"), 0); !equal(got, want) {
			t.Fatalf("after the move: %d records, want %d", len(got), len(want))
		}
	})
}

// TestAReopenWithAnOlderIncarnationFileStartsAFreshStream: a Dir whose
// incarnation file is older than the streams on the replica (restored from a
// copy, or given to another Dir's Instance) does not write into a stream that
// exists: its first append is acknowledged, with no fence met.
func TestAReopenWithAnOlderIncarnationFileStartsAFreshStream(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bucket := substratetest.NewBucket(t, "m", mem.New())
	opts := Options{Dir: dir, Bucket: bucket, Seal: quietSealOptions()}
	e, err := Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	appendBatches(t, openShard(t, e, "s"), 2)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "incarnation")); err != nil {
		t.Fatal(err)
	}
	e = open(t, opts)
	sh := openShard(t, e, "s")
	if _, err := sh.Append(ctx, []byte("after the restore")); err != nil {
		t.Fatalf("the first append after the restore: %v", err)
	}
	if inc := e.tail.Incarnation(); inc != 2 {
		t.Fatalf("incarnation %d, want 2: past the stream the replica holds", inc)
	}
}
