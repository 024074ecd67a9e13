package ownership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// acquire takes the lease of shard "s" for instance "A" with the default options.
func acquire(t *testing.T, st *Store) *Owner {
	t.Helper()
	o, _, err := Acquire(context.Background(), st, "s", instance(t, st, "A", LeaseOptions{}), LeaseOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// coldOpen is a cold open of shard "s" from bucket b alone (its driver d), by
// instance "C" with lease options lo, which then commits parts: another history,
// written on a replica while its owner could not reach it.
func coldOpen(t *testing.T, d substrate.Driver, lo LeaseOptions, parts ...manifest.Part) *Owner {
	t.Helper()
	st := NewStore(bucket(t, "b", d))
	t.Cleanup(st.Close)
	c, _, err := Acquire(context.Background(), st, "s", instance(t, st, "C", lo), lo, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if err := c.Commit(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// renew renews o's lease n times.
func renew(t *testing.T, o *Owner, n int) {
	t.Helper()
	for range n {
		if err := o.Confirm(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func bucket(t *testing.T, name string, d substrate.Driver) *substrate.Bucket {
	return substratetest.NewBucket(t, name, d)
}

func part(first, count uint64) manifest.Part {
	return manifest.Part{Key: manifest.PartKey("s", first, first+count, 1, fmt.Sprint(first)), First: first, Count: count, Size: 100, CRC: 7,
		SealedAt: time.Unix(1, 0).UTC(), Epoch: 1, Replicas: []string{"a"}}
}

func TestALeaseIsTakenOverOnlyWhenReleasedOrExpired(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	st := NewStore(bucket(t, "a", nil))
	opts := LeaseOptions{Duration: 30 * time.Second, SkewMargin: 2 * time.Second, Clock: c}
	a, prev, err := Acquire(ctx, st, "s", instance(t, st, "A", opts), opts, nil)
	if err != nil || a.Epoch() != 1 || prev.Epoch != 0 {
		t.Fatalf("first acquire: epoch %v, prev %+v, %v", a, prev, err)
	}
	var owned *manifest.OwnedError
	if _, _, err := Acquire(ctx, st, "s", instance(t, st, "B", opts), opts, nil); !errors.As(err, &owned) || owned.Owner != "A" {
		t.Fatalf("acquire of a held lease: %v, want an OwnedError naming A", err)
	}
	c.Advance(29 * time.Second) // past A's validity (30 s - 2 s), before the takeover (30 s + 2 s)
	if err := a.Valid(); !errors.Is(err, manifest.ErrLeaseExpired) || !errors.Is(err, manifest.ErrFenced) {
		t.Fatalf("A after 29 s unrenewed: %v, want ErrLeaseExpired", err)
	}
	if _, _, err := Acquire(ctx, st, "s", instance(t, st, "B", opts), opts, nil); !errors.Is(err, manifest.ErrOwned) {
		t.Fatalf("B within the skew margin: %v, want ErrOwned", err)
	}
	c.Advance(4 * time.Second)
	b, prev, err := Acquire(ctx, st, "s", instance(t, st, "B", opts), opts, nil)
	if err != nil || b.Epoch() != 2 || prev.Owner != "A" {
		t.Fatalf("B after expiry: %v, prev %+v", err, prev)
	}
	for name, op := range map[string]func() error{
		"renew":  func() error { return a.Confirm(ctx) },
		"commit": func() error { return a.Commit(ctx, part(0, 10)) },
		"valid":  a.Valid,
	} {
		if err := op(); !errors.Is(err, manifest.ErrFenced) {
			t.Fatalf("A's %s after B took over: %v, want ErrFenced", name, err)
		}
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Valid(); !errors.Is(err, manifest.ErrReleased) {
		t.Fatalf("after Release: %v", err)
	}
	a2, _, err := Acquire(ctx, st, "s", instance(t, st, "A", opts), opts, nil)
	if err != nil || a2.Epoch() != 3 {
		t.Fatalf("acquire after release: %v", err)
	}
}

func TestRenewalKeepsTheLeaseValid(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	st := NewStore(bucket(t, "a", nil))
	opts := halfMinute(c)
	h := instance(t, st, "A", opts)
	o, _, err := Acquire(ctx, st, "s", h, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	ver := manifestVersion(t, st)
	for range 10 {
		c.Advance(10 * time.Second)
		if err := h.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := o.Valid(); err != nil {
			t.Fatalf("after renewal: %v", err)
		}
	}
	if _, _, err := Acquire(ctx, st, "s", instance(t, st, "B", opts), opts, nil); !errors.Is(err, manifest.ErrOwned) {
		t.Fatalf("B while A renews: %v", err)
	}
	if got := manifestVersion(t, st); got != ver {
		t.Fatalf("the renewals of the instance lease rewrote the manifest (version %s, then %s)", ver, got)
	}
}

// manifestVersion is the version of shard "s"'s manifest on st's authority.
func manifestVersion(t *testing.T, st *Store) substrate.Version {
	t.Helper()
	_, ver, err := st.Load(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	return ver
}

func TestWaitingForALeaseTakesItOverAtExpiry(t *testing.T) {
	ctx := context.Background()
	st := NewStore(bucket(t, "a", nil))
	opts := LeaseOptions{Duration: 300 * time.Millisecond, SkewMargin: 50 * time.Millisecond}
	if _, _, err := Acquire(ctx, st, "s", instance(t, st, "A", opts), opts, nil); err != nil {
		t.Fatal(err)
	}
	opts.Wait = true
	start := time.Now()
	b, _, err := Acquire(ctx, st, "s", instance(t, st, "B", opts), opts, nil)
	if err != nil || b.Epoch() != 2 {
		t.Fatalf("waiting acquire: %v", err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("took over after %s, want after the lease's 350 ms", waited)
	}
}

func TestConcurrentAcquiresHaveOneWinner(t *testing.T) {
	ctx := context.Background()
	st := NewStore(bucket(t, "a", nil))
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_, _, err := Acquire(ctx, st, "s", instance(t, st, fmt.Sprint("i", i), LeaseOptions{}), LeaseOptions{}, nil)
			if err == nil {
				wins.Add(1)
			} else if !errors.Is(err, manifest.ErrOwned) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d instances hold the lease", wins.Load())
	}
}

func TestCommitsAppendPartsAndReachTheCopies(t *testing.T) {
	ctx := context.Background()
	auth, cp := bucket(t, "auth", nil), bucket(t, "copy", nil)
	st := NewStore(auth, cp)
	t.Cleanup(st.Close)
	o := acquire(t, st)
	if err := o.Commit(ctx, part(0, 10)); err != nil {
		t.Fatal(err)
	}
	if err := o.Commit(ctx, part(10, 5)); err != nil {
		t.Fatal(err)
	}
	if err := o.Commit(ctx, part(20, 5)); !errors.Is(err, manifest.ErrConflict) {
		t.Fatalf("a part after a gap: %v, want ErrConflict", err)
	}
	if err := st.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*substrate.Bucket{auth, cp} {
		m, err := manifest.LoadFrom(ctx, b, "s")
		if err != nil || len(m.Parts) != 2 || m.Sealed != 15 || m.Owner != "A" {
			t.Fatalf("%s: %+v, %v", b.Name(), m, err)
		}
	}
}

// TestACommitWhoseReplyWasLostIsSettledByReadingItBack: the authority took the
// write but the owner saw an error; reading the manifest back shows the commit
// landed, so it is a commit, once.
func TestACommitWhoseReplyWasLostIsSettledByReadingItBack(t *testing.T) {
	ctx := context.Background()
	fd := fault.Wrap(mem.New(), 1)
	st := NewStore(bucket(t, "auth", fd))
	o := acquire(t, st)
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: errors.New("reply lost")})
	if err := o.Commit(ctx, part(0, 10)); err != nil {
		t.Fatalf("a commit that landed: %v", err)
	}
	if err := o.Commit(ctx, part(0, 10)); err != nil {
		t.Fatalf("the same commit again: %v", err)
	}
	m, _, _ := st.Load(ctx, "s")
	if len(m.Parts) != 1 || m.Sealed != 10 {
		t.Fatalf("manifest %+v: the part is not there exactly once", m)
	}
	if err := o.Commit(ctx, part(10, 1)); err != nil {
		t.Fatalf("the owner is not fenced by its own lost reply: %v", err)
	}
}

// TestACommitWhoseOutcomeCannotBeReadBackIsUnknownUntilTheNextWrite: the write
// landed, its reply was lost, and so was the read back: the owner says it does not
// know, and its next write finds the part there.
func TestACommitWhoseOutcomeCannotBeReadBackIsUnknownUntilTheNextWrite(t *testing.T) {
	ctx := context.Background()
	fd := fault.Wrap(mem.New(), 1)
	st := NewStore(bucket(t, "auth", fd))
	o := acquire(t, st)
	fd.SetRules(
		fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: errors.New("reply lost")},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Nth: 1, Err: errors.New("read lost")})
	err := o.Commit(ctx, part(0, 10))
	if !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("commit: %v, want ErrUnknownOutcome", err)
	}
	fd.SetRules()
	if err := o.Confirm(ctx); err != nil {
		t.Fatal(err)
	}
	if m := o.Manifest(); len(m.Parts) != 1 || m.Sealed != 10 {
		t.Fatalf("after the next write the owner sees %+v: the landed part is not there", m)
	}
}

func TestAddReplicaRecordsEachLocationOnce(t *testing.T) {
	ctx := context.Background()
	auth, cp := bucket(t, "auth", nil), bucket(t, "copy", nil)
	st := NewStore(auth, cp)
	t.Cleanup(st.Close)
	o := acquire(t, st)
	p := part(0, 10)
	if err := o.Commit(ctx, p); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := o.AddReplica(ctx, p.Key, "b"); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.AddReplica(ctx, "nope", "b"); !errors.Is(err, manifest.ErrUnknownPart) {
		t.Fatalf("unknown part: %v", err)
	}
	if err := o.WaitCopies(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*substrate.Bucket{auth, cp} {
		m, err := manifest.LoadFrom(ctx, b, "s")
		if err != nil || fmt.Sprint(m.Parts[0].Replicas) != "[a b]" {
			t.Fatalf("%s: replicas %v, %v", b.Name(), m.Parts, err)
		}
	}
}

// TestConcurrentAddReplicasShareAPublish: copies recorded at once are published
// together, and every one of them is in the manifest.
func TestConcurrentAddReplicasShareAPublish(t *testing.T) {
	ctx := context.Background()
	fd := fault.Wrap(mem.New(), 1, fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Latency: 20 * time.Millisecond})
	auth := bucket(t, "auth", fd)
	st := NewStore(auth)
	o := acquire(t, st)
	const parts = 16
	for i := range parts {
		if err := o.Commit(ctx, part(uint64(i*10), 10)); err != nil {
			t.Fatal(err)
		}
	}
	before := auth.Stats().Total(substrate.OpCompareAndSwap)
	var wg sync.WaitGroup
	for _, p := range o.Manifest().Parts {
		wg.Go(func() {
			if err := o.AddReplica(ctx, p.Key, "b"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := auth.Stats().Total(substrate.OpCompareAndSwap) - before; n >= parts/2 {
		t.Fatalf("%d publishes for %d concurrent records: not grouped", n, parts)
	}
	for _, p := range o.Manifest().Parts {
		if !slices.Contains(p.Replicas, "b") {
			t.Fatalf("part %s lost its record", p.Key)
		}
	}
}

// instance takes instance's lease on st's authority, as an engine does before its
// first takeover, with the lease options opts implies.
func instance(t testing.TB, st *Store, instance string, opts LeaseOptions) *lease.Held {
	t.Helper()
	opts.EnsureDefaults()
	h, err := lease.Acquire(context.Background(), st.Authority(), lease.InstanceKey(instance), instance, nil, opts.LeaseOf())
	if err != nil {
		t.Error(err)
	}
	return h
}

// halfMinute are lease options on clock c with a 30 s lease and a 2 s skew
// margin: the timings the tests that step a clock through a lease are written in.
func halfMinute(c clock.Clock) LeaseOptions {
	return LeaseOptions{Clock: c, Duration: 30 * time.Second, SkewMargin: 2 * time.Second}
}
