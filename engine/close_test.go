package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestEngineCloseReleasesEveryShardWithinItsDeadline: guarantee
// "Engine.Close retires every shard still open (each ... releases its lease
// without sealing: the next open on this Dir seals the pages)" (engine.Close's
// doc: "Engine.Close retires the shards still open"), and the lease's
// liveness: a shard whose owner closed is taken over at once.
//
// Engine.Close retires the shards one after another under one deadline of
// Lease.Duration ("after a lease's duration the leases have run out anyway").
// Each Retire is at least one compare-and-swap on the authority, so N shards
// need N round trips; with N x RTT > Lease.Duration (1,000 shards at 30 ms
// against the default 30 s lease; the renewals were made 32-way concurrent for
// the same arithmetic) the tail shards' Release fails with the deadline. And the
// leases have not run out: the renewal loop renewed them all along (it stops
// only after the Retire loop), so the tail shards stay locked for a whole lease
// (plus the skew margin) after Close returned.
//
// Interleaving: 20 shards open, lease 2 s; the authority's manifest
// compare-and-swaps take 150 ms. Engine.Close: 20 x 150 ms = 3 s > 2 s. Another
// instance's OpenShard of each shard right after Close returns.
func TestEngineCloseReleasesEveryShardWithinItsDeadline(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fd := fault.Wrap(drv, 1)
	lease := LeaseOptions{Duration: 2 * time.Second, SkewMargin: 500 * time.Millisecond}
	e := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", fd),
		Seal: quietSealOptions(), Lease: lease, RenewEvery: 300 * time.Millisecond})
	const n = 20
	for i := range n {
		sh := openShard(t, e, fmt.Sprintf("s%d", i))
		appendBatches(t, sh, 1)
	}
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Latency: 150 * time.Millisecond})
	start := time.Now()
	cerr := e.Close()
	took := time.Since(start)

	eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", drv),
		Seal: quietSealOptions(), Lease: lease, RenewEvery: 300 * time.Millisecond})
	owned := 0
	for i := range n {
		if _, err := eB.OpenShard(ctx, fmt.Sprintf("s%d", i)); errors.Is(err, ErrOwned) {
			owned++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if owned > 0 {
		t.Fatalf("Engine.Close took %s (deadline: the %s lease) and returned %v; right after it, %d of %d shards are still leased to the closed engine (ErrOwned for another instance), and stay so for up to a lease plus the skew margin",
			took.Round(10*time.Millisecond), lease.Duration, firstLine(cerr), owned, n)
	}
}

func firstLine(err error) string {
	if err == nil {
		return "nil"
	}
	s := err.Error()
	for i, c := range s {
		if c == '\n' {
			return s[:i] + " ..."
		}
	}
	return s
}

// TestAShardCloseRacingEngineCloseCompletesItsHandover:
// guarantee "After the release it waits, within its context, until every replica
// holds the released manifest, so a cold open from any of them starts where this
// owner stopped" (Close and Retire) — Shard.Close returning nil means
// the handover reached every replica.
//
// Engine.Close skips a shard whose Close is in progress (Retire: ErrClosed,
// ignored) and does not wait for it: it closes the uploader (the Close's wait for
// uploads ends at once), flushes the copies pending at that moment and closes the
// Store. The racing Shard.Close then releases on the authority; the copier is
// closed, so the release is dropped, and WaitCopies returns nil at once ("closed"
// counts as landed). Shard.Close returns nil; replica b holds the manifest from
// before the Close's seal.
//
// Interleaving: replicas a (authority) and b; part copies to b take 300 ms.
// Shard.Close(10 s) seals the tail (commit on a) and waits for the part's copy to
// b; meanwhile (a shutdown signal) Engine.Close runs. Then read b's manifest.
func TestAShardCloseRacingEngineCloseCompletesItsHandover(t *testing.T) {
	ctx := context.Background()
	bDrv := mem.New()
	bFD := fault.Wrap(bDrv, 1)
	e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", nil)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bFD)}},
		Authority: "a", Seal: quietSealOptions(), Upload: replica.Options{BackoffMin: 5 * time.Millisecond}})
	sh := openShard(t, e, "s")
	want := appendBatches(t, sh, 2)
	flush(t, e)
	bFD.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "parts/", Latency: 300 * time.Millisecond})

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- sh.Close(cctx) }()
	waitFor(t, 5*time.Second, "the Close's part copy", func() bool { return e.uploader.Busy("s") })
	eerr := e.Close()
	serr := <-closed

	m, err := manifest.LoadFrom(ctx, substratetest.NewBucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	if serr == nil && (!m.Released || m.Sealed != uint64(len(want))) {
		t.Fatalf("Shard.Close returned nil (Engine.Close: %v): the handover is reported on every replica, but b holds seq %d released=%v sealed %d; the Close sealed %d and released",
			eerr, m.Seq, m.Released, m.Sealed, len(want))
	}
}
