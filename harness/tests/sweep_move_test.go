package tests

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
)

// TestEveryAcknowledgedRecordSurvivesTheIthFailureOfAMove is the error-index sweep
// over a move between machines: for i = 1, 2, ... the i-th substrate operation
// fails (plainly, and ambiguously) across machine A's life — its appends, whose
// pages ship to the tail — and machine B's takeover of the shard: fencing A's tail
// (when A's lease ran out) or reading it to the end A recorded (when A retired),
// importing, shipping the backlog, publishing, sealing it, appending and retiring
// in turn. Then machine C, on a clean client, takes the shard over from whoever
// holds it and must read every record A and B acknowledged, exactly once, in
// order.
func TestEveryAcknowledgedRecordSurvivesTheIthFailureOfAMove(t *testing.T) {
	for _, retire := range []bool{true, false} {
		for _, ambiguous := range []bool{false, true} {
			runs := 0
			for i := 1; ; i++ {
				if i > 400 {
					t.Fatalf("retire=%v ambiguous=%v: the sweep did not end", retire, ambiguous)
				}
				runs++
				if !sweepMove(t, i, retire, ambiguous) {
					break
				}
			}
			t.Logf("retire=%v ambiguous=%v: %d runs, the last one untouched", retire, ambiguous, runs)
		}
	}
}

// sweepMove runs one move with the i-th substrate operation failing and verifies;
// it reports whether the failure was injected.
func sweepMove(t *testing.T, i int, retire, ambiguous bool) bool {
	t.Helper()
	ctx := context.Background()
	store := t.TempDir()
	d, err := local.New(filepath.Join(store, "bucket"))
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(d, uint64(i), fault.Rule{Nth: i, Err: errInjected, Ambiguous: ambiguous})
	faulty, err := substrate.New(fd, substrate.Options{Name: "local"}) // as localBucket names it: the tail pointer names its replica
	if err != nil {
		t.Fatal(err)
	}
	defer faulty.Close()
	lease := engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}
	expired := lease.Duration + lease.SkewMargin + time.Second
	machine := func(b *substrate.Bucket, ahead time.Duration) engine.Options {
		clk := testclock.New()
		clk.Advance(ahead)
		return engine.Options{Dir: t.TempDir(), Bucket: b, Clock: clk, Lease: lease, RenewEvery: time.Second,
			Seal: seal.Options{SizeBytes: 1 << 40, Interval: 5 * time.Millisecond, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond},
			Tail: engine.TailOptions{Interval: time.Millisecond, Retry: 5 * time.Millisecond}}
	}
	var acked [][]byte
	appendSome := func(who string, sh interface {
		Append(context.Context, ...[]byte) (uint64, error)
	}, n int) {
		for b := range n {
			rs := [][]byte{fmt.Appendf(nil, "%s run %d batch %d %s", who, i, b, bytes.Repeat([]byte("x"), 100))}
			first, err := sh.Append(ctx, rs...)
			if err != nil {
				t.Fatalf("run %d: %s's append: %v", i, who, err) // a tail put that fails is put again
			}
			if first != uint64(len(acked)) {
				t.Fatalf("run %d: %s's batch %d at %d, want %d", i, who, b, first, len(acked))
			}
			acked = append(acked, rs...)
		}
	}

	eA, err := engine.Open(ctx, machine(faulty, 0))
	if err == nil {
		defer eA.Close()
		if sh, err := eA.OpenShard(ctx, "s"); err == nil {
			appendSome("A", sh, 8)
			if retire {
				sh.Retire(ctx) // may fail: then A's lease runs out, by B's clock
			}
		}
	}
	eB, err := engine.Open(ctx, machine(faulty, expired))
	if err == nil {
		defer eB.Close()
		if sh, err := eB.OpenShard(ctx, "s"); err == nil {
			appendSome("B", sh, 3)
			sh.Retire(ctx)
		}
	}
	injected := fd.Injected() > 0

	clean, err := localBucket(store)
	if err != nil {
		t.Fatal(err)
	}
	defer clean.Close()
	eC, err := engine.Open(ctx, machine(clean, 2*expired))
	if err != nil {
		t.Fatalf("run %d: C: open: %v", i, err)
	}
	defer eC.Close()
	sh, err := eC.OpenShard(ctx, "s")
	if err != nil {
		t.Fatalf("run %d (retire=%v ambiguous=%v): C takes the shard over: %v", i, retire, ambiguous, err)
	}
	got := readShard(t, sh)
	if len(got) != len(acked) {
		t.Fatalf("run %d (retire=%v ambiguous=%v): C reads %d records, %d were acknowledged", i, retire, ambiguous, len(got), len(acked))
	}
	sameRecords(t, fmt.Sprintf("run %d (retire=%v ambiguous=%v): C reads", i, retire, ambiguous), got, acked)
	return injected
}
