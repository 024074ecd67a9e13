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

// TestAnOpenShardRacingEngineCloseLeavesNoLease: guarantee "Engine.Close retires
// every shard still open (each ... releases its lease ...)" (engine.Close's doc;
// Engine.Close "retires its shards together"), and OpenShard's own
// "if the engine closed meanwhile, release" path (it calls owner.Release when it
// finds e.mu.closed after the takeover).
//
// Engine.Close does not know about a shard in e.mu.opening: it neither waits for
// it nor retires it, and goes on to close the WAL. The OpenShard's takeover
// lands on the authority afterwards (its compare-and-swap was in flight), then
// takeOver's Adopt on the closed WAL fails, and OpenShard returns that error
// without releasing the lease it just published: OpenShard's release path is
// only reached when takeOver succeeded. The manifest names this instance with a
// live, unreleased lease that nobody renews and nobody releases: another
// instance's OpenShard is refused with ErrOwned for a whole lease (plus the skew
// margin) after Engine.Close returned nil.
//
// Interleaving (deterministic): the authority's manifest put-if-absent takes
// 300 ms. OpenShard("s") starts; once the takeover's put is in flight (its
// before-hook has recorded the epoch in the WAL), Engine.Close runs: no shards
// open, it closes the WAL and returns. The put lands; Adopt: WAL closed;
// OpenShard fails. Another engine opens "s" at once.
func TestAnOpenShardRacingEngineCloseLeavesNoLease(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fd := fault.Wrap(drv, 1)
	lease := LeaseOptions{Duration: 5 * time.Second, SkewMargin: time.Second}
	e, err := Open(ctx, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", fd), Seal: quietSealOptions(), Lease: lease, RenewEvery: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent, substrate.OpCompareAndSwap}, Key: "manifest$", Latency: 300 * time.Millisecond})
	opened := make(chan error, 1)
	go func() {
		sh, err := e.OpenShard(ctx, "s")
		if err == nil {
			err = sh.Close(ctx)
		}
		opened <- err
	}()
	waitFor(t, 5*time.Second, "the takeover's put", func() bool { return fd.Calls() > 0 })
	cerr := e.Close()
	oerr := <-opened

	m, err := manifest.LoadFrom(ctx, substratetest.NewBucket(t, "a", drv), "s")
	if err != nil {
		t.Fatal(err)
	}
	eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", drv), Seal: quietSealOptions(), Lease: lease, RenewEvery: time.Second})
	_, berr := eB.OpenShard(ctx, "s")
	if errors.Is(berr, ErrOwned) || (m.Owner == e.Instance() && !m.Released) {
		t.Fatalf("Engine.Close returned %v while an OpenShard was taking the shard over; the OpenShard returned %v; the authority now holds owner %q epoch %d released=%v lease until %s (nobody renews or releases it); another instance's OpenShard: %v",
			cerr, oerr, m.Owner, m.Epoch, m.Released, m.LeaseExpiry.Format(time.RFC3339Nano), berr)
	}
}

// TestAShardCloseOutlastingEngineCloseNeverReportsAHandoverItDropped: guarantee
// "Shard.Close waits for its release to reach every replica ... so a cold open
// from any of them starts where this owner stopped" and "a wait for a copy that
// Close dropped is an error, not a success"; the earlier regression
// TestAShardCloseRacingEngineCloseCompletesItsHandover asserts exactly that a nil
// Shard.Close means every replica holds the release.
//
// Engine.Close waits for a Shard.Close in progress only until its deadline (one
// lease); past it, it closes the Store, whose copier then drops the release's
// copy. The copier's wait now says so (manifest.ErrClosed), but Shard.Close
// discards WaitCopies' result ("s.cfg.Owner.WaitCopies(ctx); return nil"), so
// the caller of Shard.Close is told the handover completed while replica b still
// holds the live, unreleased lease of before: a cold open from b sees the shard
// owned for a lease, by an owner that is gone, and any later manifest state the
// Close published is missing there.
//
// Interleaving (deterministic): replicas a (authority) and b, lease 2 s.
// Everything copied. The authority's manifest compare-and-swaps take 2.5 s.
// Shard.Close(10 s): nothing to seal; its Release is in flight. Engine.Close
// starts: its wait for the Shard.Close ends at 2 s, it closes the Store. The
// Release lands at 2.5 s; its copy is dropped; WaitCopies -> ErrClosed,
// ignored; Shard.Close returns nil.
func TestAShardCloseOutlastingEngineCloseNeverReportsAHandoverItDropped(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	aFD := fault.Wrap(aDrv, 1)
	lease := LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}
	e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", aFD)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bDrv)}},
		Authority: "a", Seal: quietSealOptions(), Lease: lease, RenewEvery: 1500 * time.Millisecond})
	sh := openShard(t, e, "s")
	flush(t, e)
	aFD.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Latency: 2500 * time.Millisecond})

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	calls := aFD.Calls()
	go func() { closed <- sh.Close(cctx) }()
	waitFor(t, 5*time.Second, "the Close's release", func() bool { return aFD.Calls() > calls })
	eerr := e.Close()
	serr := <-closed

	m, err := manifest.LoadFrom(ctx, substratetest.NewBucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	if serr == nil && !m.Released {
		t.Fatalf("Shard.Close returned nil (Engine.Close: %v): the handover is reported complete, but b holds seq %d released=%v owner %q lease until %s: the release's copy was dropped when Engine.Close closed the Store, and WaitCopies' ErrClosed was discarded",
			firstLine(eerr), m.Seq, m.Released, m.Owner, m.LeaseExpiry.Format(time.RFC3339Nano))
	}
}
