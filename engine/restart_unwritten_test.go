package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// A opens y and never writes it; its Close cannot release anything (the store
// refuses writes), so y stays owned under A's lease. A restarts on the same Dir and
// opens z only: y must be given back by the orphan pass.
func TestARestartGivesBackAShardOpenedButNeverWritten(t *testing.T) {
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	short := lateLease
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: short, RenewEvery: time.Second}
	eA := open(t, optsA)
	openShard(t, eA, "y")
	refuseShardWrites(fa)
	t.Logf("A's close: %v", eA.Close())
	fa.SetRules()
	eA2 := open(t, optsA)
	openShard(t, eA2, "z")
	eB := open(t, optsB)
	deadline := time.Now().Add(4 * time.Second) // well within the lease: only a give-back frees y
	for {
		octx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := eB.OpenShard(octx, "y")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("y, opened and never written on A, not given back by A's restarted engine: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
