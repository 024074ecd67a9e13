package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestEngineCloseEndsAnOpenWaitingForALease: guarantees "Engine.Close ...
// waits for any Shard.Close or OpenShard still running" and "one deadline bounds
// everything" (engine.Close), and Close's doc "Later calls fail with
// ErrClosed".
//
// waitShardsGone now counts e.mu.opening, but nothing tells an open in
// progress that the engine is closing: an OpenShard(WaitForLease) of a shard
// another live instance holds sleeps in ownership.Acquire on the caller's
// context. Engine.Close waits its whole deadline (one lease) for it, gives up
// ("1 shards still closing"), closes the WAL and the Store and returns; the
// OpenShard is still looping in Acquire (the holder keeps renewing), on a
// closed engine, and never returns while its context lives: a goroutine leak
// and an OpenShard that outlives its engine.
//
// Interleaving (deterministic): engine A holds "s" (lease 2 s, renewed every
// 500 ms). Engine B, same bucket, calls OpenShard("s", WaitForLease()) with a
// background context; once it is waiting, B.Close(). Close takes ~2 s and
// returns an error; 3 s later the OpenShard still has not returned.
func TestEngineCloseEndsAnOpenWaitingForALease(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	lease := LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}
	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", drv), Seal: quietSealOptions(), Lease: lease, RenewEvery: 500 * time.Millisecond})
	openShard(t, eA, "s")

	eB, err := Open(ctx, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", drv), Seal: quietSealOptions(), Lease: lease, RenewEvery: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithCancel(ctx)
	opened := make(chan error, 1)
	go func() {
		sh, err := eB.OpenShard(octx, "s", WaitForLease())
		if err == nil {
			sh.Close(ctx)
		}
		opened <- err
	}()
	time.Sleep(200 * time.Millisecond) // B's open is waiting for A's lease
	start := time.Now()
	cerr := eB.Close()
	took := time.Since(start)
	select {
	case oerr := <-opened:
		if took > time.Second {
			t.Fatalf("Engine.Close took %s (returned %v) waiting for an OpenShard that was only waiting for another instance's lease; the open then returned %v", took, cerr, oerr)
		}
	case <-time.After(3 * time.Second):
		cancel() // let the leaked OpenShard end, for goleak
		oerr := <-opened
		t.Fatalf("Engine.Close returned after %s (%v); 3 s later the OpenShard(WaitForLease) it waited for was still running on the closed engine (it returned only when its context was cancelled by the test: %v)", took, cerr, oerr)
	}
	cancel()
}
