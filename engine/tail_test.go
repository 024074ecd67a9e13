package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// tailPuts counts the put-if-absent calls on tail objects over window while
// appenders goroutines append to shards shards, round robin, as fast as they can.
func tailPuts(t *testing.T, shards, appenders int, window time.Duration) (puts uint64, appends int) {
	t.Helper()
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
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
	const window = 2 * time.Second
	one, n1 := tailPuts(t, 1, 256, window)
	many, n256 := tailPuts(t, 256, 256, window)
	t.Logf("tail puts over %s: %d with 1 busy shard (%d appends), %d with 256 (%d appends)", window, one, n1, many, n256)
	if one == 0 || many == 0 {
		t.Fatal("no tail puts")
	}
	if lo, hi := min(one, many), max(one, many); float64(hi-lo) > 0.2*float64(lo) {
		t.Fatalf("%d tail puts with 1 shard, %d with 256: more than 20%% apart", one, many)
	}
}

// TestAnIdleEngineWritesNoTailObjects: once every page is shipped, an engine with
// shards open and nothing to append puts no tail object.
func TestAnIdleEngineWritesNoTailObjects(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	bucket := e.set.Authority().Bucket
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
}
