package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// fastCollect makes an engine collect its tail every 10 ms, objects 1 ms old.
func fastCollect(o Options) Options {
	o.Tail.CollectEvery, o.Tail.CollectAfter = 10*time.Millisecond, time.Millisecond
	o.Tail.Interval = 5 * time.Millisecond
	return o
}

// streamKeys lists the data objects (not fences) of instance's incarnation inc.
func streamKeys(t *testing.T, b *substrate.Bucket, instance string, inc uint64) []string {
	t.Helper()
	data, _ := tailObjects(t, b)
	prefix := fmt.Sprintf("tail/%s/%020d/", instance, inc)
	var out []string
	for _, k := range data {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

// TestCollectionKeepsAShardsBacklogWhileItMovesToANewIncarnation: machine B,
// whose clock says A's lease on x ran out, takes x over, marking it in A's chain
// and fencing A's tail stream. A's next append to y meets the fence: A starts
// its next incarnation in one chain write, which is slow, and puts the page
// there once it lands. Meanwhile A's collector runs every 10 ms on objects 1 ms
// old. y's manifest still points into the first incarnation: its objects there
// past the pointer, and every object of the new one, are y's history, and
// collection keeps them. y retires; B opens y and reads every record A
// acknowledged, at its offset.
func TestCollectionKeepsAShardsBacklogWhileItMovesToANewIncarnation(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
	optsA = fastCollect(optsA)
	clkA, clkB := testclock.New(), testclock.New()
	optsA.Clock, optsB.Clock = clkA, clkB
	clkB.Advance(time.Minute) // past A's 30 s lease and its skew margin
	eA, eB := open(t, optsA), open(t, optsB)
	x, y := openShard(t, eA, "x"), openShard(t, eA, "y")
	var want [][]byte
	for i := range 3 {
		rs := recs(fmt.Sprintf("y%d", i), 4)
		if _, err := y.Append(ctx, rs...); err != nil {
			t.Fatal(err)
		}
		want = append(want, rs...)
	}
	if _, err := x.Append(ctx, recs("x", 4)...); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Seal(ctx, 1<<20); err != nil { // x has no backlog to move
		t.Fatal(err)
	}
	old := eA.tail.Incarnation()
	if _, err := eB.OpenShard(ctx, "x"); err != nil { // fences A's stream
		t.Fatal(err)
	}

	// A's chain writes are slow: its next incarnation starts late.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "tail-chain$", Latency: 400 * time.Millisecond})
	off0, err := y.Append(ctx, []byte("meets the fence"))
	if err != nil {
		t.Fatalf("the append that met the fence: %v", err)
	}
	if off0 != uint64(len(want)) {
		t.Fatalf("the append that met the fence is at %d, want %d", off0, len(want))
	}
	want = append(want, []byte("meets the fence"))
	if inc := eA.tail.Incarnation(); inc == old {
		t.Fatalf("the append that met the fence was acknowledged in incarnation %d, which was fenced", inc)
	}
	cur := eA.tail.Incarnation()
	t.Logf("incarnation %d holds %q", cur, streamKeys(t, optsA.Bucket, eA.Instance(), cur))
	held := recs("held", 4)
	off, err := y.Append(ctx, held...)
	if err != nil {
		t.Fatalf("an append in the new incarnation: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // collection passes over both incarnations
	fa.SetRules()
	t.Logf("incarnation %d holds %q after the move", cur, streamKeys(t, optsA.Bucket, eA.Instance(), cur))
	if err := y.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _, err := ownership.NewStore(optsB.Bucket).Load(ctx, "y"); err == nil {
		t.Logf("y's manifest: sealed %d epoch %d tail %+v", m.Sealed, m.Epoch, *m.Tail)
	}
	shB, err := eB.OpenShard(ctx, "y")
	if err != nil {
		t.Fatalf("B cannot take over y, whose %d records A acknowledged: %v", len(want), err)
	}
	if got := readAll(t, shB, 0); !holds(got, 0, want) || !holds(got, off, held) {
		t.Fatalf("B opened y with %q; A acknowledged %q at 0 and %q at %d", got, want, held, off)
	}
}

// TestARetireRightAfterASealAdvancedTheTailPointerKeepsEveryRecord: A appends to
// y, seals (the commit advances the tail pointer's From past the sealed pages),
// appends again and retires at once, while its collector runs every 10 ms on
// objects 1 ms old; B opens y and must read every acknowledged record. Held.
func TestARetireRightAfterASealAdvancedTheTailPointerKeepsEveryRecord(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, _, _ := twoMachines(t, LeaseOptions{}, 0)
	eA, eB := open(t, fastCollect(optsA)), open(t, optsB)
	y := openShard(t, eA, "y")
	want := appendBatches(t, y, 3)
	if _, err := y.Seal(ctx, 1<<20); err != nil {
		t.Fatal(err)
	}
	want = append(want, appendBatches(t, y, 2)...)
	time.Sleep(30 * time.Millisecond) // collection passes over the sealed objects
	if err := y.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	shB, err := eB.OpenShard(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, shB, 0); !equal(got, want) {
		t.Fatalf("B opened y with %q; A acknowledged %q", got, want)
	}
}
