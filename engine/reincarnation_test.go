package engine

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// checkAcked fails t, naming every acknowledged record missing from got at its
// offset.
func checkAcked(t *testing.T, who string, got [][]byte, acked map[uint64][]byte) {
	t.Helper()
	var missing []string
	for _, off := range slices.Sorted(maps.Keys(acked)) {
		if off >= uint64(len(got)) || !bytes.Equal(got[off], acked[off]) {
			have := "nothing"
			if off < uint64(len(got)) {
				have = fmt.Sprintf("%q", got[off])
			}
			missing = append(missing, fmt.Sprintf("%d: acknowledged %q, read %s", off, acked[off], have))
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%s: %d of %d acknowledged records lost (%d read):\n  %s", who, len(missing), len(acked), len(got), strings.Join(missing, "\n  "))
	}
}

// appendAcked appends rs to sh and records them in acked.
func appendAcked(t *testing.T, sh *shard.Shard, acked map[uint64][]byte, rs ...[]byte) {
	t.Helper()
	off, err := sh.Append(context.Background(), rs...)
	if err != nil {
		t.Fatalf("append %q: %v", rs[0], err)
	}
	for k, r := range rs {
		acked[off+uint64(k)] = r
	}
}

// chainWrites is a fault rule on the compare-and-swap writes of chains.
func chainWrites(latency time.Duration, err error) fault.Rule {
	return fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "/tail-chain$", Latency: latency, Err: err}
}

// localShardFenced opens two Local-mode machines, A with shard y holding 40
// acknowledged records, all shipped, and fences A's tail stream as a takeover
// of another of A's shards does. It returns A, B, y, A's faults and what y
// acknowledged.
func localShardFenced(t *testing.T) (eA, eB *Engine, y *shard.Shard, fa *fault.Driver, acked map[uint64][]byte) {
	t.Helper()
	optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
	optsA.Durability, optsB.Durability = Local, Local
	eA, eB = open(t, optsA), open(t, optsB)
	y = openShard(t, eA, "y")
	acked = map[uint64][]byte{}
	for i := range 10 {
		appendAcked(t, y, acked, recs(fmt.Sprintf("y%d", i), 4)...)
	}
	waitFor(t, 5*time.Second, "A's tail shipped", func() bool { return eA.Metrics().TailUnshippedBytes == 0 })
	if _, _, err := tail.Fence(context.Background(), optsB.Bucket, eA.Instance(), eA.tail.Incarnation(), 0); err != nil {
		t.Fatal(err)
	}
	return eA, eB, y, fa, acked
}

// TestLocalAcksDuringAReincarnationSurviveAnEngineClose: in Local mode, a
// takeover of another of A's shards fences A's tail. A's next incarnation starts
// late (a slow chain write) while y's appends are acknowledged on A's disk; A
// closes cleanly in the middle. Close retires y, which waits for its pages to be
// shipped in the next incarnation and records where they end; B, on another
// machine, reads every record A acknowledged, at its offset.
func TestLocalAcksDuringAReincarnationSurviveAnEngineClose(t *testing.T) {
	ctx := context.Background()
	eA, eB, y, fa, acked := localShardFenced(t)
	old := eA.tail.Incarnation()
	fa.SetRules(chainWrites(time.Second, nil))
	appendAcked(t, y, acked, []byte("meets the fence"))
	for i := range 3 {
		appendAcked(t, y, acked, fmt.Appendf(nil, "during the reincarnation %d", i))
	}
	if inc := eA.tail.Incarnation(); inc != old {
		t.Fatalf("A ships in incarnation %d before its chain lists it", inc)
	}
	if n := eA.Metrics().TailUnshippedBytes; n == 0 {
		t.Fatal("A reports nothing unshipped while its next incarnation has not started")
	}
	if err := eA.Close(); err != nil {
		t.Fatalf("A's close: %v", err)
	}
	fa.SetRules()
	shB, err := eB.OpenShard(ctx, "y", WaitForLease())
	if err != nil {
		t.Fatalf("B's open of y: %v", err)
	}
	checkAcked(t, "B after A's clean close", readAll(t, shB, 0), acked)
}

// TestLocalAcksDuringFailedChainWritesSurviveARetire: the same with the chain
// write failing, without landing, for a while: y's Local appends are
// acknowledged meanwhile, and none is shipped where no reader looks. Once the
// write lands y retires; B reads every record.
func TestLocalAcksDuringFailedChainWritesSurviveARetire(t *testing.T) {
	ctx := context.Background()
	eA, eB, y, fa, acked := localShardFenced(t)
	old := eA.tail.Incarnation()
	fa.SetRules(chainWrites(50*time.Millisecond, fault.ErrInjected))
	appendAcked(t, y, acked, []byte("meets the fence"))
	for i := range 3 {
		appendAcked(t, y, acked, fmt.Appendf(nil, "during the failed writes %d", i))
	}
	waitFor(t, 10*time.Second, "A's chain writes failing", func() bool { return fa.Injected() > 2 })
	if inc := eA.tail.Incarnation(); inc != old {
		t.Fatalf("A ships in incarnation %d, which its chain does not list", inc)
	}
	fa.SetRules()
	if err := y.Retire(ctx); err != nil {
		t.Fatalf("retire: %v", err)
	}
	if n := eA.Metrics().TailUnshippedBytes; n != 0 {
		t.Fatalf("A reports %d unshipped bytes after y retired", n)
	}
	shB, err := eB.OpenShard(ctx, "y")
	if err != nil {
		t.Fatalf("B's open of y: %v", err)
	}
	checkAcked(t, "B after A retired y", readAll(t, shB, 0), acked)
}

// TestTwoReincarnationsDuringAnOpenKeepRemoteAcksReachable: A opens z while its
// tail is fenced twice, in quick succession (two incarnations started while z's
// takeover ships its backlog and publishes); z's takeover points z at whichever
// incarnation it saw. z's appends are acknowledged after the open; z retires;
// B reads every record A acknowledged on z, and on y, which met both fences.
func TestTwoReincarnationsDuringAnOpenKeepRemoteAcksReachable(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
	eA, eB := open(t, optsA), open(t, optsB)
	y := openShard(t, eA, "y")
	ackedY, ackedZ := map[uint64][]byte{}, map[uint64][]byte{}
	appendAcked(t, y, ackedY, recs("y", 2)...)
	// z's takeover is slow to publish.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^shards/z/manifest$", Latency: time.Second})
	type opened struct {
		sh  *shard.Shard
		err error
	}
	done := make(chan opened, 1)
	go func() {
		sh, err := eA.OpenShard(ctx, "z")
		done <- opened{sh, err}
	}()
	time.Sleep(200 * time.Millisecond)
	first := eA.tail.Incarnation()
	for i := range 2 {
		inc := eA.tail.Incarnation()
		if _, _, err := tail.Fence(ctx, optsB.Bucket, eA.Instance(), inc, 0); err != nil {
			t.Fatal(err)
		}
		appendAcked(t, y, ackedY, fmt.Appendf(nil, "meets fence %d", i))
		if got := eA.tail.Incarnation(); got <= inc {
			t.Fatalf("y's append after fence %d was acknowledged in incarnation %d", i, got)
		}
	}
	var o opened
	select {
	case o = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("OpenShard(z) did not return")
	}
	if o.err != nil {
		t.Fatalf("OpenShard(z): %v", o.err)
	}
	m, _, _ := ownership.NewStore(optsB.Bucket).Load(ctx, "z")
	t.Logf("z's takeover points at incarnation %d (the tail was fenced at %d and %d)", m.Tail.Incarnation, first, first+1)
	appendAcked(t, o.sh, ackedZ, []byte("acknowledged after two reincarnations"))
	fa.SetRules()
	if err := o.sh.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := y.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	for id, acked := range map[string]map[uint64][]byte{"z": ackedZ, "y": ackedY} {
		sh, err := eB.OpenShard(ctx, id)
		if err != nil {
			t.Fatalf("B's open of %s: %v", id, err)
		}
		checkAcked(t, "B's "+id, readAll(t, sh, 0), acked)
	}
}

// TestATakeoverDuringAReincarnationFencesTheNewIncarnation: B takes x over from A
// (its clock says A's lease ran out) while A's next incarnation starts (its chain
// write is slow): B's mark and A's reincarnation are ordered by the chain, and
// whichever comes first, x's appends acknowledged by A are all read by B, and A
// acknowledges none after B read them. y, not taken, goes on at A. (In Local
// mode an append acknowledged on A's disk and not shipped when B fences is the
// unshipped window a takeover A did not see coming loses: it is not checked.)
func TestATakeoverDuringAReincarnationFencesTheNewIncarnation(t *testing.T) {
	for _, d := range []Durability{Remote, Local} {
		t.Run(d.String(), func(t *testing.T) {
			ctx := context.Background()
			optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
			optsA.Durability, optsB.Durability = d, d
			clkA, clkB := testclock.New(), testclock.New()
			optsA.Clock, optsB.Clock = clkA, clkB
			clkB.Advance(time.Minute) // past A's 30 s lease and its skew margin
			eA, eB := open(t, optsA), open(t, optsB)
			x, y := openShard(t, eA, "x"), openShard(t, eA, "y")
			ackedX, ackedY := map[uint64][]byte{}, map[uint64][]byte{}
			appendAcked(t, x, ackedX, recs("x", 3)...)
			appendAcked(t, y, ackedY, recs("y", 3)...)
			waitFor(t, 5*time.Second, "A's tail shipped", func() bool { return eA.Metrics().TailUnshippedBytes == 0 })
			// Another takeover fences A's tail; A's reincarnation is slow.
			if _, _, err := tail.Fence(ctx, optsB.Bucket, eA.Instance(), eA.tail.Incarnation(), 0); err != nil {
				t.Fatal(err)
			}
			fa.SetRules(chainWrites(300*time.Millisecond, nil))
			xDone := make(chan error, 1)
			go func() {
				off, err := x.Append(ctx, []byte("x during the reincarnation"))
				if err == nil && d == Remote {
					ackedX[off] = []byte("x during the reincarnation")
				}
				xDone <- err
			}()
			time.Sleep(100 * time.Millisecond)
			shB, err := eB.OpenShard(ctx, "x")
			if err != nil {
				t.Fatalf("B's takeover of x: %v", err)
			}
			if err := <-xDone; err != nil {
				t.Logf("x's append during the reincarnation: %v", err)
			}
			got := readAll(t, shB, 0)
			checkAcked(t, "B's x", got, ackedX)
			// A acknowledges nothing more of x (in Local mode, from the moment
			// its tail meets B's fence and reads the mark); y goes on.
			if d == Local {
				waitFor(t, 5*time.Second, "A's x fenced", func() bool {
					x.Append(ctx, []byte("x after B took it, in Local mode")) // its page meets the fence
					return x.Fenced()
				})
			}
			if off, err := x.Append(ctx, []byte("x after B took it")); err == nil {
				t.Fatalf("A acknowledged x's record at %d after B took x over", off)
			}
			fa.SetRules()
			appendAcked(t, y, ackedY, []byte("y after"))
			if err := y.Retire(ctx); err != nil {
				t.Fatal(err)
			}
			shY, err := eB.OpenShard(ctx, "y")
			if err != nil {
				t.Fatal(err)
			}
			checkAcked(t, "B's y", readAll(t, shY, 0), ackedY)
		})
	}
}
