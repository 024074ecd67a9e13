package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// twoMachines returns the options of two engines, each on its own Dir and its own
// client of one shared in-memory bucket; A's client goes through the returned
// fault driver. Both bucket clients carry the same name, so that a tail pointer
// one of them writes names a replica the other has.
func twoMachines(t *testing.T, lease LeaseOptions, renew time.Duration) (Options, Options, *fault.Driver, *fault.Driver) {
	t.Helper()
	drv := mem.New()
	fa, fb := fault.Wrap(drv, 1), fault.Wrap(drv, 2)
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Lease: lease, RenewEvery: renew}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fb), Seal: quietSealOptions(), Lease: lease, RenewEvery: renew}
	return optsA, optsB, fa, fb
}

// holds reports whether got holds rs at offset first.
func holds(got [][]byte, first uint64, rs [][]byte) bool {
	if first+uint64(len(rs)) > uint64(len(got)) {
		return false
	}
	return equal(got[first:first+uint64(len(rs))], rs)
}

// TestAReopenOnTheSameEngineShipsTheWholeBacklog: an append whose wait for the
// tail ends with its context (ErrOutcomeUnknown) leaves its page in the WAL past
// the acknowledged watermark, and still in the flusher, which ships it under the
// old epoch. The shard retires (the page is shipped by then) and is opened again
// on the same engine: the takeover is "ours", Adopt keeps every page, but
// shipBacklog reads the WAL through Pages, which stops at the acknowledged
// watermark, so the page is not shipped under the new epoch. The next append
// lands after it, is shipped and acknowledged, and raises the watermark over the
// page. The new epoch's tail now holds [0,4) and [8,12) with nothing for [4,8):
// machine B's open of the shard fails with ErrTailMissing, and the records A
// acknowledged at [8,12) (A reads them itself) cannot reach any other machine.
//
// Expected: B opens the shard and reads A's acknowledged records at their
// offsets. At 282ad87 B's OpenShard failed with ErrTailMissing ("holds offsets
// from 8, the records from 4 are not there"); since 8a81263 the backlog is given
// to the tail by wal.Reship, which reads every page applied, synced or not, and
// this holds. Kept as a regression test.
func TestAReopenOnTheSameEngineShipsTheWholeBacklog(t *testing.T) {
	for _, how := range []string{"retire", "close"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
			eA := open(t, optsA)
			sh := openShard(t, eA, "s")
			first := recs("first", 4)
			if _, err := sh.Append(ctx, first...); err != nil {
				t.Fatal(err)
			}
			if how == "close" {
				// A cooperative close seals what is acknowledged, leaving the
				// page of unknown outcome alone past the sealed watermark.
				if _, err := sh.Seal(ctx, 1<<20); err != nil {
					t.Fatal(err)
				}
			}
			// The tail is slow: the next append gives up waiting for it.
			fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Latency: 400 * time.Millisecond})
			actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err := sh.Append(actx, recs("unknown", 4)...)
			cancel()
			if !errors.Is(err, shard.ErrOutcomeUnknown) {
				t.Fatalf("an append that gave up waiting for the tail: %v, want ErrOutcomeUnknown", err)
			}
			fa.SetRules()
			if how == "retire" {
				if err := sh.Retire(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				time.Sleep(500 * time.Millisecond) // the page ships meanwhile
				if err := sh.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}

			sh = openShard(t, eA, "s") // ours: the WAL's pages are the backlog
			eA.sealer.Pause("s", true)
			third := recs("third", 4)
			off, err := sh.Append(ctx, third...)
			if err != nil {
				t.Fatal(err)
			}
			if off != 8 {
				t.Fatalf("the append after the reopen at %d, want 8", off)
			}
			if got := readAll(t, sh, 0); !holds(got, off, third) {
				t.Fatalf("A does not read its own acknowledged records: %q", got)
			}
			if err := sh.Retire(ctx); err != nil {
				t.Fatal(err)
			}

			eB := open(t, optsB)
			shB, err := eB.OpenShard(ctx, "s")
			if err != nil {
				t.Fatalf("B cannot take over the shard whose records A acknowledged: %v", err)
			}
			got := readAll(t, shB, 0)
			if !holds(got, 0, first) || !holds(got, off, third) {
				t.Fatalf("B reads %q; A acknowledged %q at 0 and %q at %d", got, first, third, off)
			}
		})
	}
}

// TestARetireAfterFailedChainWritesKeepsEveryRecord: machine B, whose clock
// says A's lease on x ran out (A's clock lags), takes x over and fences A's tail
// stream. A's next append to y meets the fence: A starts its next incarnation in
// one write of its chain, which fails, without landing, again and again. The
// append is not acknowledged meanwhile (its page would be in an incarnation no
// reader follows); once the chain write lands, it is, and y retires. B reads
// every record A acknowledged on y, at its offset.
func TestARetireAfterFailedChainWritesKeepsEveryRecord(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
	clkA, clkB := testclock.New(), testclock.New()
	optsA.Clock, optsB.Clock = clkA, clkB
	clkB.Advance(time.Minute) // past A's 30 s lease and its skew margin
	eA, eB := open(t, optsA), open(t, optsB)
	x, y := openShard(t, eA, "x"), openShard(t, eA, "y")
	var want [][]byte
	for i := range 10 { // ten appends, ten tail objects
		rs := recs(fmt.Sprintf("y%d", i), 4)
		if _, err := y.Append(ctx, rs...); err != nil {
			t.Fatal(err)
		}
		want = append(want, rs...)
	}
	if _, err := x.Append(ctx, recs("x", 4)...); err != nil {
		t.Fatal(err)
	}
	old := eA.tail.Incarnation()
	if _, err := eB.OpenShard(ctx, "x"); err != nil { // marks x, fences A's stream
		t.Fatal(err)
	}

	// Every write of A's chain fails, and does not land.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "tail-chain$", Err: fault.ErrInjected})
	appended := make(chan error, 1)
	go func() {
		off, err := y.Append(ctx, []byte("meets the fence"))
		if err == nil && off != uint64(len(want)) {
			err = fmt.Errorf("acknowledged at %d, want %d", off, len(want))
		}
		appended <- err
	}()
	waitFor(t, 5*time.Second, "A's chain writes failing", func() bool { return fa.Injected() > 2 })
	select {
	case err := <-appended:
		t.Fatalf("the append that met the fence returned (%v) before A's next incarnation was in its chain", err)
	case <-time.After(100 * time.Millisecond):
	}
	if inc := eA.tail.Incarnation(); inc != old {
		t.Fatalf("A ships in incarnation %d, which its chain does not list", inc)
	}
	fa.SetRules()
	if err := <-appended; err != nil {
		t.Fatalf("the append that met the fence, once the chain write landed: %v", err)
	}
	want = append(want, []byte("meets the fence"))
	if err := y.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	m, _, err := ownership.NewStore(optsB.Bucket).Load(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("y's manifest after the retire: tail %+v (A's incarnations: old %d, new %d)", *m.Tail, old, eA.tail.Incarnation())
	shB, err := eB.OpenShard(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, shB, 0); !equal(got, want) {
		t.Fatalf("B opened y with %d records; A acknowledged %d", len(got), len(want))
	}
}

// appender appends one record at a time to sh from g goroutines until stop is
// closed, and returns what was acknowledged at which offset.
type appender struct {
	mu    sync.Mutex
	acked map[uint64][]byte
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startAppender(sh *shard.Shard, g int) *appender {
	a := &appender{acked: map[uint64][]byte{}, stop: make(chan struct{})}
	for k := range g {
		a.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-a.stop:
					return
				default:
				}
				r := fmt.Appendf(nil, "%s-g%d-%d", sh.ID(), k, i)
				off, err := sh.Append(context.Background(), r)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				a.mu.Lock()
				a.acked[off] = r
				a.mu.Unlock()
			}
		})
	}
	return a
}

func (a *appender) halt() map[uint64][]byte {
	close(a.stop)
	a.wg.Wait()
	return a.acked
}

// TestTwoMachinesTakingOverAtOnceKeepEveryAcknowledgedRecord: A keeps appending
// to x while B and C, whose clocks say A's lease ran out, open x at the same
// moment. Both fence A's stream, read it and ship the backlog; one Take wins and
// the other meets it (ErrOwned). The winner holds every record A acknowledged,
// and after it retires, the loser opens x and holds them too, then its own. Held.
func TestTwoMachinesTakingOverAtOnceKeepEveryAcknowledgedRecord(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	clkA, clkL := testclock.New(), testclock.New()
	clkL.Advance(time.Minute)
	mk := func(c *testclock.Clock) Options {
		return Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Clock: c}
	}
	eA := open(t, mk(clkA))
	eB, eC := open(t, mk(clkL)), open(t, mk(clkL))
	x := openShard(t, eA, "x")
	app := startAppender(x, 4)
	time.Sleep(150 * time.Millisecond)
	var (
		wg   sync.WaitGroup
		shs  [2]*shard.Shard
		errs [2]error
	)
	for i, e := range []*Engine{eB, eC} {
		wg.Go(func() { shs[i], errs[i] = e.OpenShard(ctx, "x") })
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond)
	acked := app.halt()
	if len(acked) == 0 {
		t.Fatal("A acknowledged nothing")
	}
	win, lose := 0, 1
	if errs[0] != nil {
		win, lose = 1, 0
	}
	if errs[win] != nil || !errors.Is(errs[lose], ErrOwned) {
		t.Fatalf("the two takeovers: %v and %v, want one success and one ErrOwned", errs[0], errs[1])
	}
	checkAcked(t, "the winner", readAll(t, shs[win], 0), acked)
	more := recs("winner", 3)
	off, err := shs[win].Append(ctx, more...)
	if err != nil {
		t.Fatal(err)
	}
	if err := shs[win].Retire(ctx); err != nil {
		t.Fatal(err)
	}
	loser := []*Engine{eB, eC}[lose]
	sh := openShard(t, loser, "x")
	got := readAll(t, sh, 0)
	checkAcked(t, "the loser, after the winner retired", got, acked)
	if !holds(got, off, more) {
		t.Fatalf("the loser does not hold the winner's records at %d", off)
	}
}

// TestLostRepliesInATakeoverKeepEveryAcknowledgedRecord: B's takeover of A's
// expired shard meets a lost reply (the write landed, the caller got an error) on
// each write of its own in turn: the fence, its tail object, and the manifest
// compare-and-swap of Take. Each open that fails is retried; the shard ends with
// every record A acknowledged, once, and B's after them. Held.
func TestLostRepliesInATakeoverKeepEveryAcknowledgedRecord(t *testing.T) {
	for name, rule := range map[string]fault.Rule{
		"fence":       {Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Nth: 1},
		"tail object": {Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Nth: 2},
		"take":        {Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			optsA, optsB, _, fb := twoMachines(t, LeaseOptions{}, 0)
			clkA, clkB := testclock.New(), testclock.New()
			optsA.Clock, optsB.Clock = clkA, clkB
			clkB.Advance(time.Minute)
			eA, eB := open(t, optsA), open(t, optsB)
			x := openShard(t, eA, "x")
			want := appendBatches(t, x, 5)
			rule.Ambiguous, rule.Err = true, fault.ErrInjected
			fb.SetRules(rule)
			var sh *shard.Shard
			var err error
			for range 3 {
				if sh, err = eB.OpenShard(ctx, "x"); err == nil {
					break
				}
				t.Logf("open: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			if fb.Injected() != 1 {
				t.Fatalf("%d faults injected, want 1", fb.Injected())
			}
			fb.SetRules()
			if _, err := x.Append(ctx, []byte("late")); err == nil {
				t.Fatal("A acknowledged an append after B took x over")
			}
			mine := recs("b", 2)
			if _, err := sh.Append(ctx, mine...); err != nil {
				t.Fatal(err)
			}
			want = append(want, mine...)
			if err := sh.Retire(ctx); err != nil {
				t.Fatal(err)
			}
			eA2 := open(t, Options{Dir: t.TempDir(), Bucket: optsB.Bucket, Seal: quietSealOptions()})
			if got := readAll(t, openShard(t, eA2, "x"), 0); !equal(got, want) {
				t.Fatalf("a third machine reads %q, want %q", got, want)
			}
		})
	}
}

// TestAnEngineClosedWhileMovingToANewIncarnationKeepsEveryRecord: a takeover of
// another of A's shards fences A's stream; A's next incarnation is slow to start
// (a slow chain write), and A closes while it starts, an append of y waiting for
// it. Close retires y, which waits for y's pages to be shipped and records
// where they end, in the new incarnation. B reads every record A acknowledged,
// following A's chain from y's pointer.
func TestAnEngineClosedWhileMovingToANewIncarnationKeepsEveryRecord(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, fa, _ := twoMachines(t, LeaseOptions{}, 0)
	eA, eB := open(t, optsA), open(t, optsB)
	y := openShard(t, eA, "y")
	var want [][]byte
	for i := range 10 { // ten appends, ten tail objects
		rs := recs(fmt.Sprintf("y%d", i), 4)
		if _, err := y.Append(ctx, rs...); err != nil {
			t.Fatal(err)
		}
		want = append(want, rs...)
	}
	old := eA.tail.Incarnation()
	// A takeover of another of A's shards fences A's stream.
	if _, _, err := tail.Fence(ctx, optsB.Bucket, eA.Instance(), old, 0); err != nil {
		t.Fatal(err)
	}
	// A's chain write is slow: its next incarnation is still starting when A
	// closes.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "tail-chain$", Latency: 500 * time.Millisecond})
	appended := make(chan error, 1)
	go func() {
		_, err := y.Append(ctx, []byte("meets the fence"))
		appended <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if inc := eA.tail.Incarnation(); inc != old {
		t.Fatalf("A ships in incarnation %d before its chain lists it", inc)
	}
	if err := eA.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-appended; err == nil {
		want = append(want, []byte("meets the fence"))
	} else {
		t.Logf("the append that met the fence: %v", err)
	}

	m, _, err := ownership.NewStore(optsB.Bucket).Load(ctx, "y")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("y's manifest after A closed: released %v, tail %+v (A's streams: old %d, new %d)", m.Released, *m.Tail, old, old+1)
	shB, err := eB.OpenShard(ctx, "y", WaitForLease())
	if err != nil {
		return // refusing is safe: nothing is silently lost
	}
	if got := readAll(t, shB, 0); !holds(got, 0, want) {
		t.Fatalf("B opened y with %d records; A acknowledged %d", len(got), len(want))
	}
}
