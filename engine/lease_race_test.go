package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// A takeover whose write landed with its reply lost, and whose read-back failed,
// leaves the manifest naming this instance's lease while no shard of this engine
// owns it. With a lease per shard that ownership ran out after a lease; with one
// lease per instance it lives as long as the engine renews, which it does every
// RenewEvery: no other instance can open the shard (ErrOwned, and WaitForLease
// waits forever), though nobody serves it.
//
//  1. A's OpenShard("s"): the takeover's put-if-absent lands, the reply is lost,
//     the read-back fails; OpenShard returns an error.
//  2. A stays up and renews its instance lease, interval after interval.
//  3. Three leases later, B's OpenShard("s") is still refused with ErrOwned.
func TestATakeoverWhoseOutcomeWasUnknownDoesNotHoldTheShardForever(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	drv := mem.New()
	fd := fault.Wrap(drv, 1,
		fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: `^shards/s/manifest$`, Nth: 1, Ambiguous: true, Err: fault.ErrInjected},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Key: `^shards/s/manifest$`, Nth: 2, Err: fault.ErrInjected})
	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "p", fd), Clock: clk, Seal: quietSealOptions()})
	_, aerr := eA.OpenShard(ctx, "s")
	if aerr == nil {
		t.Fatal("the takeover's outcome was settled: the faults did not hit it")
	}
	fd.SetRules()
	reader := substratetest.NewBucket(t, "p", drv)
	m, err := manifest.LoadFrom(ctx, reader, "s")
	if err != nil {
		t.Fatal(err)
	}
	if m.Owner != eA.Instance() || m.Released {
		t.Fatalf("the takeover did not land (owner %q): the faults did not hit it", m.Owner)
	}
	if !errors.Is(aerr, manifest.ErrUnknownOutcome) {
		t.Fatalf("A's OpenShard: %v, want manifest.ErrUnknownOutcome", aerr)
	}
	t.Logf("A's OpenShard: %v (manifest.ErrUnknownOutcome: %v)", aerr, errors.Is(aerr, manifest.ErrUnknownOutcome))

	expiry := func() time.Time {
		r, _, err := lease.Read(ctx, reader, lease.InstanceKey(eA.Instance()))
		if err != nil {
			t.Fatal(err)
		}
		return r.Expiry
	}
	total := 3 * eA.opts.Lease.Duration
	for elapsed := time.Duration(0); elapsed < total; elapsed += eA.opts.RenewEvery {
		last := expiry()
		clk.Advance(eA.opts.RenewEvery)
		deadline := time.Now().Add(20 * time.Second) // liveness only
		for !expiry().After(last) {
			if time.Now().After(deadline) {
				t.Fatal("A's instance lease was not renewed")
			}
			time.Sleep(time.Millisecond)
		}
	}

	eB := open(t, Options{Dir: t.TempDir(), Bucket: reader, Clock: clk, Seal: quietSealOptions()})
	if _, err := eB.OpenShard(ctx, "s"); err != nil {
		t.Fatalf("%s after A's takeover of s failed with an unknown outcome (%v), A serves no shard s and renews its lease; B's OpenShard: %v (ErrOwned: %v)",
			total, aerr, err, errors.Is(err, ErrOwned))
	}
}
