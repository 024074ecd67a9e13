package engine

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
)

// stallClock is a testclock whose Now, once armed, blocks the tail flusher's call
// that satisfies the armed condition, from inside tail.(*Flusher).ship, until
// released. ship calls Now twice per object: before its put, and after the put
// succeeded, with f.mu held, between nextSeq.Store(stream.Next()) and the closing of
// the object's tickets. The condition tells the second call from the first (the
// flusher's Next has moved), so the flusher stops with Next already past the object
// just put while the tickets of the pages in it still say "not shipped".
type stallClock struct {
	*testclock.Clock
	mu      sync.Mutex
	cond    func() bool // nil: disarmed
	hit     chan struct{}
	release chan struct{}
}

func newStallClock() *stallClock { return &stallClock{Clock: testclock.New()} }

// arm makes the next flusher call of Now for which cond holds block; the returned
// channel is closed once it does, and unblock lets it go on.
func (c *stallClock) arm(cond func() bool) (hit <-chan struct{}, unblock func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cond, c.hit, c.release = cond, make(chan struct{}), make(chan struct{})
	rel := c.release
	var once sync.Once
	return c.hit, func() { once.Do(func() { close(rel) }) }
}

func (c *stallClock) Now() time.Time {
	c.mu.Lock()
	cond := c.cond
	c.mu.Unlock()
	if cond != nil && inFlusherShip() && cond() {
		c.mu.Lock()
		if c.cond == nil { // another caller took it
			c.mu.Unlock()
			return c.Clock.Now()
		}
		c.cond = nil
		hit, rel := c.hit, c.release
		c.mu.Unlock()
		close(hit)
		<-rel
	}
	return c.Clock.Now()
}

// inFlusherShip reports whether the caller is tail.(*Flusher).ship.
func inFlusherShip() bool {
	pc := make([]uintptr, 8)
	n := runtime.Callers(3, pc) // Callers, inFlusherShip, Now
	frames := runtime.CallersFrames(pc[:n])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "internal/tail.(*Flusher).ship") {
			return true
		}
		if !more {
			return false
		}
	}
}

// gapFixture is machine A after step 5 of the interleaving that
// TestASealDoesNotMoveTheTailPointerPastAnObjectItsTicketsHaveNotHeardOf lays out:
// s sealed through 8 with the tail pointer as that seal left it, [8,9]
// acknowledged and shipped in object n, the flusher going on again.
type gapFixture struct {
	optsB Options
	eA    *Engine
	sh    *shard.Shard
	want  [][]byte // every record A acknowledged so far
	n     uint64   // the object holding [8,9]
	from  uint64   // the tail pointer's From after the seal
}

// sealPastAShippedPage drives A through steps 1 to 5 in mode; B's options share
// A's bucket.
func sealPastAShippedPage(t *testing.T, mode Durability) *gapFixture {
	t.Helper()
	ctx := context.Background()
	optsA, optsB, _, _ := twoMachines(t, LeaseOptions{}, 0)
	clkA := newStallClock()
	optsA.Clock, optsB.Clock = clkA, testclock.New()
	optsA.Durability, optsB.Durability = mode, mode
	eA := open(t, optsA)
	fx := &gapFixture{optsB: optsB, eA: eA, sh: openShard(t, eA, "s")}
	for _, n := range []int{1, 1, 2, 1, 3} { // [0] [1] [2,3] [4] [5,6,7]
		fx.appendPage(t, n)
	}
	var sealedBytes uint64
	for _, r := range fx.want {
		sealedBytes += uint64(len(r))
	}
	if _, _, err := eA.tail.Until(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	fx.n = eA.tail.Next().Sequence

	// The flusher stops after putting object n, before resolving its tickets.
	hit, unblock := clkA.arm(func() bool { return eA.tail.Next().Sequence > fx.n })
	defer unblock()
	page89 := recs("r8", 2)
	appended := make(chan error, 1)
	go func() {
		off, err := fx.sh.Append(ctx, page89...)
		if err == nil && off != 8 {
			err = fmt.Errorf("append at %d, want 8", off)
		}
		appended <- err
	}()
	select {
	case <-hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the flusher never put the object holding [8,9]")
	}
	if mode == Local {
		if err := <-appended; err != nil {
			t.Fatal(err)
		}
	}

	// A seal of [0,8) commits now, with the pointer's From from TailFrom(s, 8). It
	// runs beside the stalled flusher: as the code stands it does not wait for it
	// and returns at once; a TailFrom that asks the flusher under its lock waits
	// for it instead, and the flusher goes on after a while.
	type sealed struct {
		records uint64
		err     error
	}
	sealDone := make(chan sealed, 1)
	go func() {
		res, err := fx.sh.Seal(ctx, sealedBytes)
		sealDone <- sealed{res.Records, err}
	}()
	var res sealed
	select {
	case res = <-sealDone:
		unblock()
	case <-time.After(2 * time.Second):
		unblock()
		res = <-sealDone
	}
	if res.err != nil || res.records != 8 {
		t.Fatalf("the seal sealed %d records (%v), want 8", res.records, res.err)
	}
	fx.from = fx.sh.Manifest().Tail.From
	if mode == Remote {
		if err := <-appended; err != nil {
			t.Fatal(err)
		}
	}
	fx.want = append(fx.want, page89...)
	return fx
}

// appendPage appends one page of n records at the end of what A acknowledged.
func (fx *gapFixture) appendPage(t *testing.T, n int) {
	t.Helper()
	rs := recs(fmt.Sprintf("r%d", len(fx.want)), n)
	off, err := fx.sh.Append(context.Background(), rs...)
	if err != nil {
		t.Fatal(err)
	}
	if off != uint64(len(fx.want)) {
		t.Fatalf("append at %d, want %d", off, len(fx.want))
	}
	fx.want = append(fx.want, rs...)
}

// checkPointer reports a tail pointer moved past the object holding [8,9].
func (fx *gapFixture) checkPointer(t *testing.T) {
	t.Helper()
	if fx.from > fx.n {
		t.Errorf("the seal of [0,8) moved the tail pointer to %d, past object %d, which holds [8,9]", fx.from, fx.n)
	}
}

// openOnB opens s on B, with B's clock moved on by skip first, and checks that B
// reads every record A acknowledged.
func (fx *gapFixture) openOnB(t *testing.T, skip time.Duration) {
	t.Helper()
	fx.optsB.Clock.(*testclock.Clock).Advance(skip)
	eB := open(t, fx.optsB)
	shB, err := eB.OpenShard(context.Background(), "s")
	if err != nil {
		t.Fatalf("B cannot open the shard: %v", err)
	}
	if got := readAll(t, shB, 0); !equal(got, fx.want) {
		t.Fatalf("B reads %d records %q; A acknowledged %d: %q", len(got), got, len(fx.want), fx.want)
	}
}

// TestASealDoesNotMoveTheTailPointerPastAnObjectItsTicketsHaveNotHeardOf: the
// interleaving behind the simulation's "the tail of l0-…/2 holds offsets from 10,
// the records from 8 are not there".
//
//  1. A's shard s has pages [0] [1] [2,3] [4] [5,6,7], all shipped; the flusher's
//     Next is n.
//  2. A appends [8,9]: the WAL gives the page to the flusher (wal.go, Append:
//     f.Add, and st.mu.given gets {8, ticket}).
//  3. The flusher puts object n holding [8,9]. Put succeeded; ship (flusher.go
//     ~397) stores nextSeq = n+1 and only then, a few lines later (~412), closes
//     the object's tickets. In between, with f.mu held, it calls Clock.Now (~402),
//     where this test holds it.
//  4. A seal of s seals [0,8) (it read the WAL before [8,9] was acknowledged in
//     Remote mode; here its budget stops it at the page boundary 8, as any seal
//     whose WAL view ended at 8 does) and asks wal.Log.TailFrom(s, 8) where the
//     records past the part are (internal/sealer/job.go, Job.run). TailFrom (ship.go:188) loads
//     f.Next() = n+1, then finds the first given page at or past 8, [8,9], whose
//     ticket is not done: "not shipped yet: it goes at or after f.Next()" — but it
//     went in n. TailFrom returns n+1.
//  5. CommitTail (internal/ownership/lease.go) advances the pointer's From to n+1: the
//     manifest now says sealed 8, records past it from object n+1 on.
//  6. The flusher goes on; [10,11] and [12,13,14] ship in n+1 and later. Retire
//     records Until past them (Tail.Until, ReleaseWithBacklog).
//  7. B opens s: readTail reads [n+1, Until), whose first section of s starts at
//     10: ErrTailMissing, "holds offsets from 10, the records from 8 are not
//     there". Records 8 and 9, acknowledged by A (in Remote mode, durable on the
//     object store), are in object n, behind the pointer; no owner can open s.
//
// With nothing appended after [8,9] the same pointer loses them silently: see
// TestASealPastAJustShippedPageLosesNoAcknowledgedRecord.
//
// Expected: B opens s and reads all 15 records.
func TestASealDoesNotMoveTheTailPointerPastAnObjectItsTicketsHaveNotHeardOf(t *testing.T) {
	for _, mode := range []Durability{Local, Remote} {
		t.Run(mode.String(), func(t *testing.T) {
			fx := sealPastAShippedPage(t, mode)
			fx.appendPage(t, 2) // [10,11]
			fx.appendPage(t, 3) // [12,13,14]
			if err := fx.sh.Retire(context.Background()); err != nil {
				t.Fatal(err)
			}
			fx.checkPointer(t)
			fx.openOnB(t, 0)
		})
	}
}

// TestASealPastAJustShippedPageLosesNoAcknowledgedRecord: the interleaving above
// with [8,9] the last page A acknowledged. The next owner's read of the tail,
// from the pointer (n+1) to Until after a Retire (Tail.Until: n+1), or to the
// fence it puts after a lease that ran out (at n+1), holds no section of s at all,
// which readTail takes for "nothing past the sealed watermark": B opens s at 8
// without an error, and 8 and 9, acknowledged by A (in Remote mode: durable on the
// object store before the ack), are gone; B's next append would take offset 8.
//
// Expected: B reads all 10 records.
func TestASealPastAJustShippedPageLosesNoAcknowledgedRecord(t *testing.T) {
	for _, mode := range []Durability{Local, Remote} {
		for _, end := range []string{"retire", "expiry"} {
			t.Run(mode.String()+"/"+end, func(t *testing.T) {
				fx := sealPastAShippedPage(t, mode)
				skip := time.Duration(0)
				if end == "retire" {
					if err := fx.sh.Retire(context.Background()); err != nil {
						t.Fatal(err)
					}
				} else {
					// A keeps running but stops renewing as far as B can tell: B's
					// clock passes A's lease and the skew margin, and B fences A's tail.
					if _, _, err := fx.eA.tail.Until(context.Background(), "s"); err != nil {
						t.Fatal(err)
					}
					var lease ownership.LeaseOptions
					lease.EnsureDefaults()
					skip = lease.Duration + lease.SkewMargin + time.Second
				}
				fx.checkPointer(t)
				fx.openOnB(t, skip)
			})
		}
	}
}
