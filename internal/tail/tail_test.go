package tail

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// tailFixture is a Tail of instance "i" on a bucket whose driver faults can
// disturb, and a bucket of the same store without them (another machine's).
type tailFixture struct {
	tail   *Tail
	b      *substrate.Bucket // the tail's
	other  *substrate.Bucket // undisturbed
	faults *fault.Driver
	mu     sync.Mutex
	taken  []Mark
	incs   uint64
}

func newTail(t *testing.T, flush FlushOptions) *tailFixture {
	t.Helper()
	drv := mem.New()
	fx := &tailFixture{faults: fault.Wrap(drv, 1)}
	var err error
	if fx.b, err = substrate.New(fx.faults, substrate.Options{Name: "tail"}); err != nil {
		t.Fatal(err)
	}
	if fx.other, err = substrate.New(drv, substrate.Options{Name: "tail"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fx.b.Close(); fx.other.Close() })
	fx.tail = fx.open(t, flush)
	return fx
}

// open opens another Tail of the fixture's instance: a new process of it.
func (fx *tailFixture) open(t *testing.T, flush FlushOptions) *Tail {
	if flush.Interval == 0 {
		flush.Interval = time.Millisecond
	}
	if flush.Retry == 0 {
		flush.Retry = 5 * time.Millisecond
	}
	tl := Open(Options{
		Bucket: fx.b, Instance: "i", Flush: flush,
		NextIncarnation: func(after uint64) (uint64, error) {
			fx.mu.Lock()
			defer fx.mu.Unlock()
			fx.incs = max(fx.incs, after) + 1
			return fx.incs, nil
		},
		Taken: func(shard string, epoch uint64) {
			fx.mu.Lock()
			defer fx.mu.Unlock()
			fx.taken = append(fx.taken, Mark{Shard: shard, Epoch: epoch})
		},
	})
	t.Cleanup(func() { tl.Close(context.Background()) })
	return tl
}

func (fx *tailFixture) started(t *testing.T, tl *Tail) Position {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	at, err := tl.Position(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// writes counts the conditional writes on b so far.
func writes(b *substrate.Bucket) uint64 {
	st := b.Stats()
	return st.Total(substrate.OpPutIfAbsent) + st.Total(substrate.OpCompareAndSwap) + st.Total(substrate.OpPut)
}

// chainOf reads the instance's chain, undisturbed.
func (fx *tailFixture) chain(t *testing.T) Chain {
	t.Helper()
	c, _, err := ReadChain(t.Context(), fx.other, "i")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAReincarnationWritesTheSameWhateverTheNumberOfShards: a stream fenced with
// a page of every shard pending; the tail starts its next incarnation and ships
// them there. The object-store writes from the fence until every page is shipped
// are the same with 1 shard and with 256: the put that met the fence, one chain
// write, and the one object that holds every shard's page.
func TestAReincarnationWritesTheSameWhateverTheNumberOfShards(t *testing.T) {
	counted := map[int]uint64{}
	for _, shards := range []int{1, 256} {
		fx := newTail(t, FlushOptions{})
		at := fx.started(t, fx.tail)
		for s := range shards {
			wait(t, fx.tail.Add(fmt.Sprint("s", s), 1, 0, records(1, "before")))
		}
		done := fx.tail.Gather() // the next pages go out together, after the fence
		var tickets []*Ticket
		for s := range shards {
			tickets = append(tickets, fx.tail.Add(fmt.Sprint("s", s), 1, 1, records(1, "after")))
		}
		if _, _, err := Fence(t.Context(), fx.other, "i", at.Incarnation, 0); err != nil {
			t.Fatal(err)
		}
		before := writes(fx.b)
		done()
		wait(t, tickets...)
		counted[shards] = writes(fx.b) - before
		if inc := fx.tail.Incarnation(); inc != at.Incarnation+1 {
			t.Fatalf("%d shards: shipping in incarnation %d, want %d", shards, inc, at.Incarnation+1)
		}
		for s := range shards {
			secs, err := ReadShard(t.Context(), fx.other, "i", at.Incarnation+1, 0, NoFence, fmt.Sprint("s", s))
			if err != nil || len(secs) != 1 || secs[0].First != 1 {
				t.Fatalf("%d shards: shard s%d's page in the new incarnation: %+v, %v", shards, s, secs, err)
			}
		}
	}
	t.Logf("writes of a reincarnation: %d with 1 shard, %d with 256", counted[1], counted[256])
	if counted[1] != counted[256] || counted[256] > 3 {
		t.Fatalf("writes of a reincarnation: %d with 1 shard, %d with 256; want the same, at most 3", counted[1], counted[256])
	}
}

// TestNothingIsAcknowledgedBeforeTheChainListsTheIncarnation: the chain write
// of the next incarnation fails, again and again, without landing; a page given
// after the fence is not acknowledged until it lands, and then it is, in the
// incarnation the chain lists as live.
func TestNothingIsAcknowledgedBeforeTheChainListsTheIncarnation(t *testing.T) {
	fx := newTail(t, FlushOptions{})
	at := fx.started(t, fx.tail)
	wait(t, fx.tail.Add("a", 1, 0, records(1, "before")))
	if _, _, err := Fence(t.Context(), fx.other, "i", at.Incarnation, 0); err != nil {
		t.Fatal(err)
	}
	fx.faults.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "tail-chain$", Err: fault.ErrInjected})
	tk := fx.tail.Add("a", 1, 1, records(1, "after"))
	deadline := time.Now().Add(10 * time.Second)
	for fx.faults.Injected() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, done, err := tk.State(); done {
		t.Fatalf("a page was resolved (%v) before the chain listed its incarnation", err)
	}
	if live, _ := fx.chain(t).Live(); live.N != at.Incarnation {
		t.Fatalf("the chain's live incarnation is %d, want still %d", live.N, at.Incarnation)
	}
	fx.faults.SetRules()
	wait(t, tk)
	shipped, _, _ := tk.State()
	live, ok := fx.chain(t).Live()
	if !ok || live.N != shipped.Incarnation || shipped.Incarnation == at.Incarnation {
		t.Fatalf("the page shipped in incarnation %d; the chain's live one is %d (%v), the fenced one %d", shipped.Incarnation, live.N, ok, at.Incarnation)
	}
}

// TestATakenShardsPagesFailAndTheOthersShip: a takeover marks shard a (epoch 1)
// in the chain and fences the live incarnation. The tail's next incarnation
// sees the mark: a's pending page fails, and so does every page of a under
// epoch 1 given later, Taken is told; b's page ships, and so does a page of a
// under a later epoch (this instance's own later ownership).
func TestATakenShardsPagesFailAndTheOthersShip(t *testing.T) {
	fx := newTail(t, FlushOptions{})
	at := fx.started(t, fx.tail)
	wait(t, fx.tail.Add("a", 1, 0, records(1, "a0")), fx.tail.Add("b", 1, 0, records(1, "b0")))
	if _, err := MarkTaken(t.Context(), fx.other, "i", "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Fence(t.Context(), fx.other, "i", at.Incarnation, 0); err != nil {
		t.Fatal(err)
	}
	done := fx.tail.Gather()
	ta, tb := fx.tail.Add("a", 1, 1, records(1, "a1")), fx.tail.Add("b", 1, 1, records(1, "b1"))
	done()
	wait(t, tb)
	if err := ta.Wait(t.Context()); !errors.Is(err, ErrFenced) {
		t.Fatalf("the taken shard's pending page: %v, want ErrFenced", err)
	}
	if err := fx.tail.Add("a", 1, 2, records(1, "a2")).Wait(t.Context()); !errors.Is(err, ErrFenced) {
		t.Fatalf("a page of the taken shard given later: %v, want ErrFenced", err)
	}
	wait(t, fx.tail.Add("a", 2, 2, records(1, "a2 under epoch 2")))
	fx.mu.Lock()
	taken := fx.taken
	fx.mu.Unlock()
	if len(taken) != 1 || taken[0] != (Mark{Shard: "a", Epoch: 1}) {
		t.Fatalf("Taken was told %v, want [{a 1}]", taken)
	}
}

// TestAReaderFollowsAShardThroughTwoReincarnations: a shard's pages in three
// incarnations, two fences apart (one right after the other); a reader from the
// shard's first position, marking it taken, reads every record once, in order;
// one with the shard's release end stops there without writing anything.
func TestAReaderFollowsAShardThroughTwoReincarnations(t *testing.T) {
	fx := newTail(t, FlushOptions{})
	first := fx.started(t, fx.tail)
	var want [][]byte
	add := func(tag string) {
		recs := records(2, tag)
		wait(t, fx.tail.Add("s", 3, uint64(len(want)), recs))
		want = append(want, recs...)
	}
	add("one")
	for range 2 {
		inc := fx.tail.Incarnation()
		if _, _, err := Fence(t.Context(), fx.other, "i", inc, 0); err != nil {
			t.Fatal(err)
		}
		add("meets the fence")
		if got := fx.tail.Incarnation(); got != inc+1 {
			t.Fatalf("shipping in incarnation %d after a fence of %d", got, inc)
		}
	}
	add("last")
	until, _, err := fx.tail.Until(t.Context(), "s")
	if err != nil {
		t.Fatal(err)
	}
	p := Pointer{Instance: "i", From: first, Until: until}
	before := writes(fx.other)
	h, err := ReadHistory(t.Context(), fx.other, p, "s", 3, 0, HistoryOptions{Take: true})
	if err != nil || !sameRecords(h.Records, want) {
		t.Fatalf("read to the release's end: %q, %v; want %q", h.Records, err, want)
	}
	if w := writes(fx.other) - before; w != 0 || h.Fenced {
		t.Fatalf("a read to a release's end wrote %d objects (fenced %v)", w, h.Fenced)
	}
	p.Until = Position{}
	h, err = ReadHistory(t.Context(), fx.other, p, "s", 3, 2, HistoryOptions{Take: true})
	if err != nil || !sameRecords(h.Records, want[2:]) || !h.Fenced {
		t.Fatalf("a takeover's read from offset 2: %q, fenced %v, %v; want %q", h.Records, h.Fenced, err, want[2:])
	}
	if !fx.chain(t).Taken("s", 3) {
		t.Fatal("the takeover's read did not mark the shard")
	}
	if err := fx.tail.Add("s", 3, uint64(len(want)), records(1, "after the takeover")).Wait(t.Context()); !errors.Is(err, ErrFenced) {
		t.Fatalf("a page of the shard after the takeover: %v, want ErrFenced", err)
	}
}

func sameRecords(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if string(a[i]) != string(b[i]) {
			return false
		}
	}
	return true
}

// TestACleanCloseEndsTheIncarnationAndTheNextProcessBeginsWithoutAFence: a
// tail closed with everything shipped ends its incarnation in the chain; the
// next process of the instance starts without putting a fence; a process that
// stopped without Close has its live incarnation fenced and ended by the next,
// and can ship nothing more in it.
func TestACleanCloseEndsTheIncarnationAndTheNextProcessBeginsWithoutAFence(t *testing.T) {
	fx := newTail(t, FlushOptions{})
	wait(t, fx.tail.Add("s", 1, 0, records(1, "x")))
	first := fx.tail.Incarnation()
	if err := fx.tail.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := fx.chain(t)
	if _, live := c.Live(); live || len(c.Incarnations) != 1 || c.Incarnations[0].End != 1 {
		t.Fatalf("after a clean close the chain is %+v, want incarnation %d ended at 1", c, first)
	}
	puts := fx.b.Stats().Total(substrate.OpPutIfAbsent)
	second := fx.open(t, FlushOptions{})
	fx.started(t, second)
	if n := fx.b.Stats().Total(substrate.OpPutIfAbsent) - puts; n != 0 {
		t.Fatalf("the next process put %d objects to start", n)
	}
	wait(t, second.Add("s", 1, 1, records(1, "y")))

	// A third process while the second still runs: it fences the second's.
	third := fx.open(t, FlushOptions{})
	fx.started(t, third)
	if err := second.Add("s", 1, 2, records(1, "z")).Wait(t.Context()); !errors.Is(err, ErrFenced) {
		t.Fatalf("the replaced process's page: %v, want ErrFenced", err)
	}
	c = fx.chain(t)
	if live, _ := c.Live(); live.N != third.Incarnation() || len(c.Incarnations) != 3 || c.Incarnations[1].End != 1 {
		t.Fatalf("chain %+v: want the second incarnation ended at 1 and the third live", c)
	}
}

// TestCollectingADeadInstanceEndsItsLiveIncarnationFirst: a pass that collects
// a dead instance's tail, whose live incarnation's objects no shard needs,
// fences that incarnation and ends it in the chain before it deletes them: the
// instance's writer, if it comes back, meets the fence at its next put rather
// than put into a stream whose objects are gone, and a reader stops at the end.
func TestCollectingADeadInstanceEndsItsLiveIncarnationFirst(t *testing.T) {
	ctx := t.Context()
	b := bucket(t)
	if _, err := Begin(ctx, b, "dead", 1); err != nil {
		t.Fatal(err)
	}
	w := NewStream(b, "dead", 1, 0, "w")
	for i := range 3 {
		if _, err := w.Put(ctx, []Section{{Shard: "s", Epoch: 1, First: uint64(i), Records: records(1, "x")}}); err != nil {
			t.Fatal(err)
		}
	}
	collector := Open(Options{
		Bucket: b, Instance: "survivor",
		NextIncarnation: func(after uint64) (uint64, error) { return after + 1, nil },
		Collect: CollectOptions{
			View: func(context.Context, string) (View, error) { return View{Epoch: 2, Sealed: 3}, nil }, // sealed by another owner
			Dead: func(context.Context) ([]string, error) { return []string{"dead"}, nil },
		},
	})
	defer collector.Close(ctx)
	for range 2 { // the first pass sees the objects, the second finds them old
		if _, err := collector.CollectOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := objects(t, b); n != 1 {
		t.Fatalf("%d tail objects left of the dead instance's 3 and its fence, want the fence alone", n)
	}
	c, _, err := ReadChain(ctx, b, "dead")
	if err != nil || len(c.Incarnations) != 1 || !c.Incarnations[0].Ended || c.Incarnations[0].End != 3 {
		t.Fatalf("the dead instance's chain: %+v, %v; want incarnation 1 ended at 3", c, err)
	}
	if _, err := w.Put(ctx, []Section{{Shard: "s", Epoch: 1, First: 3, Records: records(1, "back")}}); !errors.Is(err, ErrFenced) {
		t.Fatalf("the dead instance's writer, back, put: %v; want ErrFenced", err)
	}
}
