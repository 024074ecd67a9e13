package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// A owns y and cannot release it at Close (its shard writes fail), so its lease is
// kept. A restarts on the same Dir: the new lease carries the old token, and y
// (known to the WAL) is an orphan to give back. A user's open of y on the
// restarted engine is in flight (its manifest read slow) when the orphan pass first
// looks at y, and then fails. The pass must not take ErrShardOpen for settled: y
// must be given back, so that machine D opens it.
func TestARestartsOrphanIsGivenBackAfterAnOpenThatFailed(t *testing.T) {
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	stall := &stallRead{Driver: drv}
	short := lateLease
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	eA := open(t, optsA)
	appendBatches(t, openShard(t, eA, "y"), 2)
	refuseShardWrites(fa)
	t.Logf("A's Close, its shard writes failing: %v", eA.Close())

	optsA2 := optsA
	optsA2.Bucket = substratetest.NewBucket(t, "shared", stall)
	eA2 := open(t, optsA2)
	stalled := stall.arm(`^shards/y/manifest$`)
	uctx, cancel := context.WithTimeout(context.Background(), 3500*time.Millisecond) // across the restarted engine's first renewals
	defer cancel()
	done := make(chan error)
	go func() {
		_, err := eA2.OpenShard(uctx, "y")
		done <- err
	}()
	<-stalled
	t.Logf("the user's open of y on the restarted engine: %v", <-done)

	optsD := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	eD := open(t, optsD)
	bound := 4 * short.Duration
	deadline := time.Now().Add(bound)
	for {
		octx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := eD.OpenShard(octx, "y")
		cancel()
		if err == nil {
			return
		}
		if !errors.Is(err, ErrOwned) || time.Now().After(deadline) {
			t.Fatalf("%s after the restarted engine's open of y failed, D still cannot open y: %v", bound, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
