package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
)

// TestAFollowerNeverYieldsARecordWhoseAppendFailed: a read returns acknowledged
// records only, records whose Append returned success; a following read yields
// each as soon as it is acknowledged, and no sooner.
//
// The interleaving: a follower waits at the end of shard s after the record
// "before". An append of "maybe" enters the WAL and its sync is held; the
// engine's clock moves past the instance lease meanwhile (a renewal that has not
// run yet); the sync is let go. The WAL raises its acknowledged end when the sync
// returns and wakes the follower; only then does shard.Append check the lease
// again, find it lapsed, and return ErrOutcomeUnknown: the record was never
// acknowledged. Expected: the follower yields nothing past "before", and
// Info().Readable stays at 1. Found: the follower yields "maybe" at offset 1, and
// Readable is 2, although the append that wrote it failed.
func TestAFollowerNeverYieldsARecordWhoseAppendFailed(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	held, fs := newHeldSyncs()
	e := open(t, Options{Dir: t.TempDir(), Clock: clk, FS: fs, Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	// A seal would commit, and renew the lease, while the sync is held.
	e.sealer.Pause("s", true)
	if _, err := sh.Append(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := follow(fctx, sh, 0)
	select {
	case rec := <-got:
		if rec.err != nil || rec.Offset != 0 {
			t.Fatalf("the follower's first step: %d %q %v", rec.Offset, rec.Value, rec.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not yield the acknowledged record")
	}

	held.held.Store(true)
	result := make(chan error, 1)
	go func() { _, err := sh.Append(ctx, []byte("maybe")); result <- err }()
	select {
	case <-held.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the append's sync never started")
	}
	clk.Skip(e.opts.Lease.Duration)
	held.held.Store(false)
	close(held.release)
	if err := <-result; !errors.Is(err, shard.ErrOutcomeUnknown) {
		t.Fatalf("an append durable after its lease ran out: %v; want ErrOutcomeUnknown", err)
	}
	if r := sh.Info().Readable; r != 1 {
		t.Errorf("Readable is %d after an append that failed, want 1", r)
	}
	select {
	case rec := <-got:
		if rec.err == nil {
			t.Fatalf("the follower yielded %q at %d, whose append returned ErrOutcomeUnknown", rec.Value, rec.Offset)
		}
	case <-time.After(500 * time.Millisecond):
	}
}
