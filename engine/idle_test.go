package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// An idle engine's only object-store write is its instance lease's renewal: one
// conditional write per RenewEvery whatever its number of shards, and no manifest
// written, on the authority or as a copy on another replica.
func TestAnIdleEngineMakesOneLeaseWritePerInterval(t *testing.T) {
	const shards = 1000
	ctx := context.Background()
	clk := testclock.New()
	authDrv, farDrv := mem.New(), mem.New()
	auth, far := memBucket(t, "auth", authDrv), memBucket(t, "far", farDrv)
	e := open(t, Options{
		Dir: t.TempDir(), Clock: clk, Seal: quietSealOptions(),
		Replicas: []replica.Spec{{Name: "auth", Domain: "a", Bucket: auth}, {Name: "far", Domain: "b", Bucket: far}},
	})
	// Opened and appended to together: in Remote mode an append waits for its
	// tail flush.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range shards {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			sh, err := e.OpenShard(ctx, fmt.Sprintf("s%04d", i))
			if err == nil {
				_, err = sh.Append(ctx, []byte("one"))
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if err := e.store.Flush(ctx); err != nil { // the takeovers' copies land
		t.Fatal(err)
	}
	reader := memBucket(t, "reader", authDrv) // the test's reads are not the engine's
	expiry := func() time.Time {
		r, _, err := lease.Read(ctx, reader, lease.InstanceKey(e.Instance()))
		if err != nil {
			t.Fatal(err)
		}
		return r.Expiry
	}
	writes := func() map[string]uint64 {
		out := make(map[string]uint64)
		for name, b := range map[string]*substrate.Bucket{"auth": auth, "far": far} {
			s := b.Stats()
			for _, op := range []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap, substrate.OpDelete} {
				if n := s.Total(op); n > 0 {
					out[name+" "+string(op)] = n
				}
			}
		}
		return out
	}
	before := writes()
	const intervals = 6
	for i := range intervals {
		last := expiry()
		clk.Advance(e.opts.RenewEvery)
		deadline := time.Now().Add(20 * time.Second) // liveness only
		for !expiry().After(last) {
			if time.Now().After(deadline) {
				t.Fatalf("interval %d: the instance lease was not renewed", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := e.store.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	after := writes()
	for k, n := range after {
		after[k] = n - before[k]
		if after[k] == 0 {
			delete(after, k)
		}
	}
	want := map[string]uint64{"auth " + string(substrate.OpCompareAndSwap): intervals}
	if fmt.Sprint(after) != fmt.Sprint(want) {
		t.Fatalf("%d idle shards over %d renewal intervals made the writes %v, want %v (one conditional write per interval)",
			shards, intervals, after, want)
	}
	for i := range shards {
		if err := e.mu.owners[fmt.Sprintf("s%04d", i)].Valid(); err != nil {
			t.Fatalf("shard %d after %d intervals: %v", i, intervals, err)
		}
	}
}

func memBucket(t *testing.T, name string, d substrate.Driver) *substrate.Bucket {
	t.Helper()
	b, err := substrate.New(d, substrate.Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}
