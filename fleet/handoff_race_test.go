package fleet

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// memMember is an engine over its own fault-wrapped client of the shared mem
// driver, joined to a fleet of the shards given with short periods.
type memMember struct {
	e  *engine.Engine
	m  *Membership
	fd *fault.Driver
}

func joinMem(t *testing.T, drv substrate.Driver, shards []Shard, opts Options) *memMember {
	t.Helper()
	return joinMemWith(t, drv, shards, opts, engine.Options{})
}

// joinMemWith is joinMem with engine options.
func joinMemWith(t *testing.T, drv substrate.Driver, shards []Shard, opts Options, eopts engine.Options) *memMember {
	t.Helper()
	fd := fault.Wrap(drv, 1)
	e := memMachineWith(t, eopts, fd)
	opts.Shards = func(context.Context) ([]Shard, error) { return shards, nil }
	if opts.PollEvery == 0 {
		opts.PollEvery = 50 * time.Millisecond
	}
	if opts.PublishEvery == 0 {
		opts.PublishEvery = 50 * time.Millisecond
	}
	if opts.RetryEvery == 0 {
		opts.RetryEvery = 20 * time.Millisecond
	}
	m, err := Join(t.Context(), e, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fd.SetRules()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := m.Leave(ctx); err != nil && !errors.Is(err, ErrLeft) {
			t.Logf("cleanup leave of %s: %v", m.ID(), err)
		}
	})
	return &memMember{e: e, m: m, fd: fd}
}

func shardsN(n int) []Shard {
	var ss []Shard
	for i := range n {
		ss = append(ss, Shard{ID: fmt.Sprintf("s%02d", i)})
	}
	return ss
}

// eventually polls cond every 10 ms until it holds or d passed (a liveness
// bound), and reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// openOn reports whether every shard is open on one of ms.
func openOn(shards []Shard, ms ...*memMember) bool {
	for _, s := range shards {
		found := false
		for _, mm := range ms {
			if _, ok := mm.m.Shard(s.ID); ok {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// appendEach appends one record to each shard on whichever of ms has it open,
// waiting for a shard between owners.
func appendEach(t *testing.T, shards []Shard, ms ...*memMember) {
	t.Helper()
	for _, s := range shards {
		ok := eventually(10*time.Second, func() bool {
			for _, mm := range ms {
				if sh, open := mm.m.Shard(s.ID); open {
					if _, err := sh.Append(t.Context(), []byte("rec-"+s.ID)); err == nil {
						return true
					} else if errors.Is(err, shard.ErrOutcomeUnknown) {
						t.Fatalf("append %s: %v", s.ID, err)
					}
				}
			}
			return false
		})
		if !ok {
			t.Fatalf("no append to %s was acknowledged", s.ID)
		}
	}
}

// A Leave whose context ends while drains it started are sealing: the run's
// context is cancelled under them, Shard.Drain then returns without releasing
// (its ctx ended), and the fleet forgets the shard. The engine stays open and
// keeps renewing its instance lease, so nobody can open the shard: it is held by
// a member that left, open nowhere.
func TestLeaveWhoseContextEndsMidDrainLeavesNoShardHeld(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	a := joinMem(t, drv, shards, Options{DrainDeadline: 10 * time.Second})
	if !eventually(10*time.Second, func() bool { return len(a.m.Owned()) == 4 }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	b := joinMem(t, drv, shards, Options{DrainDeadline: 10 * time.Second})
	if !eventually(10*time.Second, func() bool { return len(b.m.Owned()) >= 1 && openOn(shards, a, b) }) {
		t.Fatalf("a owns %v, b %v", a.m.Owned(), b.m.Owned())
	}
	time.Sleep(200 * time.Millisecond)
	held := a.m.Owned()
	appendEach(t, shards, a, b)
	// a's part uploads now hang well within its drain deadline.
	a.fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent}, Key: "/parts/", Latency: 3 * time.Second})

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	err := a.m.Leave(ctx)
	cancel()
	t.Logf("a held %v; its Leave with a 500 ms context returned %v; a owns %v after it", held, err, a.m.Owned())
	a.fd.SetRules()

	if !eventually(5*time.Second, func() bool { return openOn(shards, b) }) {
		t.Fatalf("5 s after a left (its engine open), b owns %v of %v: the shards a was draining when its Leave's context ended stay leased to a, open nowhere", b.m.Owned(), len(shards))
	}
}

// A drain whose release fails for a reason other than its deadline (the
// manifest's writes fail for a moment) returns an error; the fleet logs it and
// forgets the shard. Its lease stays with the member's instance, which its engine
// keeps renewing, so the shard's next owner gets ErrOwned for as long as that
// engine lives, although the fault is long gone: the shard is stuck unowned while
// the fleet is stable.
func TestADrainWhoseReleaseFailsDoesNotStrandTheShard(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	a := joinMem(t, drv, shards, Options{DrainDeadline: 5 * time.Second})
	if !eventually(10*time.Second, func() bool { return len(a.m.Owned()) == 4 }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	appendEach(t, shards, a)
	// Every write of a's manifests fails, for a second.
	a.fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: `^shards/[^/]+/manifest$`, Err: fault.ErrInjected})
	b := joinMem(t, drv, shards, Options{})
	if !eventually(10*time.Second, func() bool { return a.m.Stats().Revocations > 0 }) {
		t.Fatalf("no handoff began: a owns %v", a.m.Owned())
	}
	time.Sleep(time.Second)
	a.fd.SetRules()
	sa := a.m.Stats()
	t.Logf("a: %d handoffs, %d cooperative, %d forced, %d failures; owns %v", sa.Revocations, sa.Cooperative, sa.Forced, sa.Failures, a.m.Owned())

	p, _, err := readAssignment(t.Context(), a.e.Authority(), "default")
	if err != nil {
		t.Fatal(err)
	}
	var toB []Shard
	for _, s := range shards {
		if p.Shards[s.ID] == b.m.ID() {
			toB = append(toB, s)
		}
	}
	if !eventually(5*time.Second, func() bool { return len(toB) > 0 && openOn(toB, b) }) {
		t.Fatalf("5 s after the fault ended, b owns %v of the shards assigned to it %v: the shard whose handoff failed stays leased to a's live instance, open nowhere", b.m.Owned(), toB)
	}
}

// Leave with a context that has ended retires the shards still open, as its
// documentation says ("the rest are retired: forced"), through drain with one
// context of DrainDeadline for all of them, drained one after another. The first
// drain's deadline and that context's end are the same instant, so Shard.Drain
// finds its ctx done and returns without retiring; every later drain starts with
// the context over. None is released, and the engine, still open, keeps them.
// (b leads here, so that a's leader lease is not what holds the shards back.)
func TestLeaveWithAnEndedContextRetiresTheRest(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	b := joinMem(t, drv, shards, Options{})
	if !eventually(10*time.Second, func() bool { return len(b.m.Owned()) == 4 && b.m.Stats().Leader }) {
		t.Fatalf("b owns %v", b.m.Owned())
	}
	a := joinMem(t, drv, shards, Options{Weight: 3, DrainDeadline: 300 * time.Millisecond})
	if !eventually(10*time.Second, func() bool { return len(a.m.Owned()) >= 2 && openOn(shards, a, b) }) {
		t.Fatalf("a owns %v, b %v", a.m.Owned(), b.m.Owned())
	}
	time.Sleep(200 * time.Millisecond)
	held := a.m.Owned()
	appendEach(t, shards, a, b)
	a.fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent}, Key: "/parts/", Latency: 3 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := a.m.Leave(ctx)
	sa := a.m.Stats()
	t.Logf("a held %v; Leave with an ended context: %v; %d handoffs, %d forced, %d cooperative", held, err, sa.Revocations, sa.Forced, sa.Cooperative)
	a.fd.SetRules()
	if !eventually(5*time.Second, func() bool { return openOn(shards, b) }) {
		p, _, _ := readAssignment(t.Context(), b.e.Authority(), "default")
		t.Fatalf("5 s after a left, b (the leader) owns %v of %d; the assignment is %v; a's lease attributes %v: the shards a's Leave was to retire stay leased to a's live instance (and, its lease still naming the fleet, a stays a member)",
			b.m.Owned(), len(shards), p.Shards, a.e.Attributes())
	}
}

// The same Leave, by the leader: the drains used up the one context of
// DrainDeadline, so the leader lease's release fails too (context deadline
// exceeded), and no other member can lead until it runs out.
func TestLeaveWithAnEndedContextReleasesTheLeaderLease(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	a := joinMem(t, drv, shards, Options{DrainDeadline: 300 * time.Millisecond})
	if !eventually(10*time.Second, func() bool { return len(a.m.Owned()) == 4 && a.m.Stats().Leader }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	appendEach(t, shards, a)
	a.fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent}, Key: "/parts/", Latency: 3 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := a.m.Leave(ctx)
	t.Logf("Leave with an ended context: %v", err)
	a.fd.SetRules()
	r, _, rerr := lease.Read(t.Context(), a.e.Authority(), leaderKey("default"))
	if rerr != nil {
		t.Fatal(rerr)
	}
	if r.Live(time.Now(), 0) {
		t.Fatalf("after its Leave returned, the leader lease is still %q's until %s", r.Holder, r.Expiry.Format(time.RFC3339Nano))
	}
}
