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

// TestCloseWaitsOutAReplicaBlipForItsRelease: guarantee "Close
// of a shard waits for its release copy within its ctx" ("After the
// release it waits, within its context, until every replica holds the released
// manifest, so a cold open from any of them starts where this owner stopped"), and
// Engine.Close "gives the releases' copies its deadline before it stops copying".
//
// Interleaving: replica b refuses manifest writes for 1.8 s (a blip). Shard.Close,
// with 10 s of context, seals, releases, and WaitCopies returns at the first failed
// copy attempt: Close used to return within ~1 s; it now waits
// through the retries. Engine.Close (30 s deadline) runs
// Store.Flush, which also returns at the next failed attempt (the 1 s retry, still
// inside the blip), then Store.Close drops the copy. The blip ends; b keeps the
// manifest from before the Close: not released, without the part the Close sealed.
// A cold open from b alone (machine C, b its only replica) is refused with ErrOwned
// by a lease that was released, and once that lease runs out it would read 0 of the
// 8 records the Close sealed.
func TestCloseWaitsOutAReplicaBlipForItsRelease(t *testing.T) {
	ctx := context.Background()
	bDrv := mem.New()
	bFD := fault.Wrap(bDrv, 1)
	e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", nil)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bFD)}},
		Authority: "a", Seal: quietSealOptions(), Upload: replica.Options{BackoffMin: 5 * time.Millisecond}})
	sh := openShard(t, e, "s")
	want := appendBatches(t, sh, 2)
	flush(t, e) // b holds the takeover's manifest

	bFD.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Err: errors.New("b: 503 for a moment")})
	blipEnds := time.Now().Add(1800 * time.Millisecond)
	go func() { time.Sleep(time.Until(blipEnds)); bFD.SetRules() }()

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := sh.Close(cctx); err != nil {
		t.Fatal(err)
	}
	closeTook := time.Since(start)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	engineCloseTook := time.Since(start) - closeTook
	time.Sleep(time.Until(blipEnds) + 100*time.Millisecond)

	m, err := manifest.LoadFrom(ctx, substratetest.NewBucket(t, "b", bDrv), "s")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Released || m.Sealed != uint64(len(want)) {
		// Show what a cold open from b alone gets.
		got, cerr := coldRead(t, substratetest.NewBucket(t, "b", bDrv), "b")
		t.Fatalf("Shard.Close returned nil after %s of its 10 s, Engine.Close after %s of its 30 s; the blip on b lasted 1.8 s; "+
			"b now holds seq %d released=%v sealed %d (the Close sealed %d and released); a cold open from b: %d records, %v",
			closeTook.Round(10*time.Millisecond), engineCloseTook.Round(10*time.Millisecond), m.Seq, m.Released, m.Sealed, len(want), len(got), cerr)
	}
}

// TestAPartInDoubtIsSettledAndCopiedWhenItsShardRetires: guarantees "every
// committed part is copied to every replica" and "counts are honest".
//
// Interleaving: a seal's commit lands on the authority, its reply and read back are
// lost (ErrUnknownOutcome): the part is a doubt held in memory by the Shard, to be
// settled by the shard's next seal (the scheduler's, 500 ms later at its backoff).
// Before that the shard retires, and Retire must settle it (a lag move, or Engine.Close, which retires every
// open shard). The doubt goes with the Shard: the part is in the manifest, on a
// only, its file is removed at the next open, and no copy is ever queued for it.
// After a reopen on the same Dir and a cooperative Close with every upload
// flushed, the part is still on one replica, and the engines counted no seal for
// it.
func TestAPartInDoubtIsSettledAndCopiedWhenItsShardRetires(t *testing.T) {
	ctx := context.Background()
	aFD := fault.Wrap(mem.New(), 1)
	second := substratetest.NewBucket(t, "b", nil)
	opts := Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", aFD)}, {Name: "b", Domain: "d2", Bucket: second}},
		Authority: "a", Seal: quietSealOptions(), Upload: replica.Options{BackoffMin: 5 * time.Millisecond, Attempts: 3}}
	e := open(t, opts)
	sh := openShard(t, e, "s")
	want := appendBatches(t, sh, 2)
	aFD.SetRules(
		fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Ambiguous: true, Err: errors.New("reply lost")},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Key: "manifest$", Nth: 1, Err: errors.New("read back lost")})
	if _, err := sh.Seal(ctx, 1<<30); !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("seal: %v, want ErrUnknownOutcome", err)
	}
	aFD.SetRules()
	if err := sh.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	seals := e.Metrics().Seals
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	e2 := open(t, opts)
	sh2 := openShard(t, e2, "s")
	if got := readAll(t, sh2, 0); !equal(got, want) {
		t.Fatalf("read %d records, want %d", len(got), len(want))
	}
	if err := sh2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	flush(t, e2)
	seals += e2.Metrics().Seals
	m := sh2.Manifest()
	for _, p := range m.Parts {
		if _, err := second.Attributes(ctx, p.Key); err != nil || len(p.Replicas) != 2 {
			t.Errorf("part %s (committed, from doubt) is named on %v; on b: %v", p.Key, p.Replicas, err)
		}
	}
	if seals != uint64(len(m.Parts)) {
		t.Errorf("%d parts committed, %d seals counted", len(m.Parts), seals)
	}
}

// TestACloseIsNotHeldForeverByAReplicaThatHangs: guarantees "a replica that stays
// down does not hold [the handover] forever" and the lease's liveness:
// a shard whose owner stopped serving it is taken over within a lease.
//
// The part uploader's attempts used to be bounded by nothing but Engine.Close, and
// Shard.Close waited for them as long as its context allowed. Now every attempt has
// a timeout and Close waits for uploads at most a lease, then releases.
//
// Interleaving: replica b accepts connections and never answers part writes (a
// black-holed region: every request hangs). Shard.Close(context.Background())
// seals the tail: the commit on the authority a succeeds, the copy of the part to
// b hangs. Close waits for that copy forever. Meanwhile the engine's renewal loop
// keeps renewing the lease (the owner is still registered until the shard closes), so the
// shard is closed to appends here and yet no other instance can take it over:
// B's OpenShard gets ErrOwned lease after lease. Only Engine.Close (cancelling
// the uploader) unblocks it.
func TestACloseIsNotHeldForeverByAReplicaThatHangs(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	bFD := fault.Wrap(bDrv, 1)
	lease := LeaseOptions{Duration: 2 * time.Second, SkewMargin: 500 * time.Millisecond}
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
