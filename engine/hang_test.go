package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestACloseIsNotHeldForeverByAReplicaThatHangs: guarantees "a replica that stays
// down does not hold [the handover] forever" (DESIGN 7) and the lease's liveness:
// a shard whose owner stopped serving it is taken over within a lease.
//
// The part uploader's attempts used to be bounded by nothing but Engine.Close, and
// Shard.Close waited for them as long as its context allowed. Now every attempt has
// a timeout and Close waits for uploads at most a lease, then releases.
//
// Interleaving: replica b accepts connections and never answers part writes (a
// black-holed region: every request hangs). Shard.Close(context.Background())
// seals the tail: the commit on the authority a succeeds, the copy of the part to
// b hangs. Close polls Uploading() forever. Meanwhile the engine's renewal loop
// keeps renewing the lease (the owner is still registered until OnClose), so the
// shard is closed to appends here and yet no other instance can take it over:
// B's OpenShard gets ErrOwned lease after lease. Only Engine.Close (cancelling
// the uploader) unblocks it.
func TestACloseIsNotHeldForeverByAReplicaThatHangs(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	bFD := fault.Wrap(bDrv, 1)
	lease := manifest.LeaseOptions{Duration: 2 * time.Second, SkewMargin: 500 * time.Millisecond}
	e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", aDrv)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bFD)}},
		Authority: "a", Seal: quietSealOptions(), Lease: lease, RenewEvery: 200 * time.Millisecond,
		Upload: replica.Options{BackoffMin: 5 * time.Millisecond}})
	sh := openShard(t, e, "s")
	appendBatches(t, sh, 2)
	bFD.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent},
		Key: "parts/", Latency: time.Hour})

	closed := make(chan error, 1)
	go func() { closed <- sh.Close(context.Background()) }()
	t.Cleanup(func() {
		e.Close() // cancels the uploader: the hanging put returns, Close goes on
		<-closed
	})

	eB := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", aDrv)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bDrv)}},
		Authority: "a", Seal: quietSealOptions(), Lease: lease, RenewEvery: 200 * time.Millisecond})
	wait := 3 * lease.Duration
	select {
	case err := <-closed:
		closed <- err
		t.Logf("Close returned %v", err)
		return
	case <-time.After(wait):
	}
	_, err := eB.OpenShard(ctx, "s")
	t.Fatalf("Shard.Close has not returned after %s (3 leases) because replica b hangs on a part copy; the shard takes no appends, "+
		"and the engine keeps renewing its lease: another instance's OpenShard: %v (ErrOwned: %v)", wait, err, errors.Is(err, ErrOwned))
}
