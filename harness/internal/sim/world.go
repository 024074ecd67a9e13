// Package sim runs whole fleets of l0 engines through crashes, power loss,
// partitions, slow and ambiguous object-store calls, clock jumps, corruption and
// moves, all chosen by one seed, and checks every step against the engine's
// promises (see check.go).
//
// Each simulated machine is an engine on its own in-memory file system that keeps
// only what was synced, with its own clock and its own client of one shared
// in-memory object store, behind a fault wrapper. The seed alone decides the
// schedule: which operation or fault comes at each step, on which machine and
// shard, with which records. The schedule never depends on how earlier steps
// turned out (an operation that does not apply, an append to a shard the machine
// has not open, is recorded as skipped), so a seed replays the same schedule.
// What Go's scheduler does with the engine's goroutines is not reproducible: the
// outcomes of a replay can differ, and the trace prints both.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/internal/testfs"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// Config is one run.
type Config struct {
	Seed  uint64
	Steps int // default 150
	// Machines is 2 to 4; 0 lets the seed choose.
	Machines int
	// Shards is how many shards the fleet writes; default 3.
	Shards int
	// Fleet runs the machines as members of a fleet, which places the shards
	// (see fleet.go); a schedule of its own, with seeds of its own.
	Fleet bool
}

// Result is what a run did and, if it broke a promise, how.
type Result struct {
	Seed       uint64
	Fleet      bool
	Steps, Ops int            // steps of the schedule, operations that applied
	Faults     map[string]int // faults injected, by kind
	Trace      []string
	// Violation is the first broken promise, empty if none.
	Violation string
}

// Failed reports a broken promise.
func (r *Result) Failed() bool { return r.Violation != "" }

// Report is the seed, the violation, the trace and how to replay it.
func (r *Result) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %s\n", r.Seed, r.Violation)
	mode := ""
	if r.Fleet {
		mode = " -sim.fleet"
	}
	fmt.Fprintf(&b, "replay: go -C harness test ./internal/sim -run 'TestSimulationHoldsTheInvariants$' -count=1 -v -args -sim.seed=%d%s\n", r.Seed, mode)
	b.WriteString("trace:\n")
	for _, l := range r.Trace {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// The timings of a simulated machine. Leases run on the simulated clocks, which
// move only when the schedule says; the engine's pacing timers fire on those
// clocks or, at the latest, after their real duration (see testclock).
const (
	leaseDuration = 3 * time.Second
	skewMargin    = 500 * time.Millisecond
	opTimeout     = 400 * time.Millisecond // a call on a partitioned machine gives up
	maxUnshipped  = 64 << 10               // Local mode's window, in bytes
)

var errPartitioned = errors.New("sim: machine partitioned from the object store")

// world is the fleet, the shared store and the oracle.
type world struct {
	rng      *rand.Rand
	extra    *rand.Rand  // the extras' draws (see extraStep)
	store    *mem.Driver // the authority, and the tail's replica
	far      *mem.Driver // a second replica machines attach
	machines []*machine
	// outsider, in fleet mode, is a machine outside the fleet that takes
	// shards over by hand (see steal).
	outsider *machine
	kinds    []kind // the schedule's steps, with their weights
	fleet    *fleetView
	shards   []string
	o        *oracle
	tails    *tails
	res      *Result
	start    time.Time
	dead     sync.WaitGroup // engines of crashed machines, closing
	traceMu  sync.Mutex     // guards res.Trace and res.Violation
	records  int            // records named so far
}

// machine is one server: a Dir on its own file system, a clock, a client.
type machine struct {
	name   string
	fs     *vfs.MemFS
	clock  *testclock.Clock
	client *fault.Driver
	bucket *substrate.Bucket
	// attached is set once the machine's engine has the far replica too, through
	// its own client of it.
	attached  bool
	farClient *fault.Driver
	farBucket *substrate.Bucket
	mode      engine.Durability
	e         *engine.Engine
	open      map[string]*shard.Shard
	mb        *fleet.Membership // in fleet mode, while the engine is a member
	// partitioned is set while every call of the client fails; faults while
	// slow or ambiguous calls are injected.
	partitioned bool
	faults      string
	lives       int // engines opened on this machine
}

// Run runs one seeded simulation.
func Run(cfg Config) *Result {
	if cfg.Steps == 0 {
		cfg.Steps = 150
	}
	if cfg.Shards == 0 {
		cfg.Shards = 3
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	if cfg.Machines == 0 {
		cfg.Machines = 2 + rng.IntN(3)
	}
	w := &world{
		rng: rng, extra: rand.New(rand.NewPCG(cfg.Seed, 0xe7a5)), store: mem.New(), far: mem.New(), start: time.Now(),
		res: &Result{Seed: cfg.Seed, Fleet: cfg.Fleet, Faults: map[string]int{}}, kinds: kinds,
	}
	w.o = newOracle(w)
	var err error
	if w.tails, err = newTails(w); err != nil {
		w.violate("observer: %v", err)
		return w.res
	}
	for i := range cfg.Shards {
		w.shards = append(w.shards, fmt.Sprintf("s%d", i))
	}
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	newMachine := func(name string) *machine {
		// Clocks disagree by less than the skew margin, as the lease argument
		// assumes.
		skew := time.Duration(rng.Int64N(int64(skewMargin/2))) - skewMargin/4
		m := &machine{name: name, fs: vfs.NewCrashableMem(), clock: testclock.NewAt(base.Add(skew)), mode: engine.Durability(rng.IntN(2))}
		w.tracef("%s joins (%s mode, clock %+v)", m.name, m.mode, skew)
		return m
	}
	for i := range cfg.Machines {
		m := newMachine(fmt.Sprintf("m%d", i))
		w.machines = append(w.machines, m)
		if err := w.boot(m); err != nil {
			w.violate("%s: first open: %v", m.name, err)
			return w.res
		}
	}
	defer w.shutdown()
	step, finish := w.step, w.finish
	if cfg.Fleet {
		w.outsider = newMachine("x")
		if err := w.startFleet(); err != nil {
			w.violate("%v", err)
			return w.res
		}
		step, finish = w.fleetStep, w.finishFleet
	}
	for i := range cfg.Steps {
		w.res.Steps = i + 1
		step(i)
		if w.res.Failed() {
			return w.res
		}
	}
	finish()
	return w.res
}

// all are the machines, and the outsider if there is one.
func (w *world) all() []*machine {
	if w.outsider == nil {
		return w.machines
	}
	return append(slices.Clone(w.machines), w.outsider)
}

// tracef and violate may be called from a burst's operations at once.
func (w *world) tracef(format string, args ...any) {
	w.traceMu.Lock()
	defer w.traceMu.Unlock()
	w.res.Trace = append(w.res.Trace, fmt.Sprintf("%7.3fs ", time.Since(w.start).Seconds())+fmt.Sprintf(format, args...))
}

func (w *world) violate(format string, args ...any) {
	w.traceMu.Lock()
	first := w.res.Violation == ""
	if first {
		w.res.Violation = fmt.Sprintf(format, args...)
	}
	w.traceMu.Unlock()
	if first {
		w.tracef("VIOLATION: %s", w.res.Violation)
	}
}

// options are a machine's engine options: short leases on its clock, small
// seals and fast pacing, so that a few dozen steps see seals, collections and
// expiries.
func (m *machine) options() engine.Options {
	o := engine.Options{
		Dir: "/" + m.name, FS: testfs.SlowSyncs(m.fs, 200*time.Microsecond), Clock: m.clock, Durability: m.mode,
		Lease:      engine.LeaseOptions{Duration: leaseDuration, SkewMargin: skewMargin},
		RenewEvery: 500 * time.Millisecond,
		Seal: seal.Options{SizeBytes: 2 << 10, Age: 2 * time.Second, Interval: 5 * time.Millisecond,
			BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		Tail: engine.TailOptions{Interval: 2 * time.Millisecond, Retry: 5 * time.Millisecond,
			CollectEvery: 20 * time.Millisecond, CollectAfter: 50 * time.Millisecond,
			MaxUnshippedBytes: maxUnshipped, MaxUnshippedAge: 500 * time.Millisecond},
		Upload: replica.Options{BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
	}
	o.Replicas = []replica.Spec{{Name: "store", Domain: "default", Bucket: m.bucket}}
	if m.attached {
		o.Replicas = append(o.Replicas, replica.Spec{Name: "far", Domain: "far", Bucket: m.farBucket})
	}
	return o
}

// boot opens an engine on m's file system with a fresh client.
func (w *world) boot(m *machine) error {
	m.client, m.farClient = fault.Wrap(w.store, w.rng.Uint64()), fault.Wrap(w.far, w.rng.Uint64())
	b, err := substrate.New(m.client, substrate.Options{Name: "store"})
	if err != nil {
		return err
	}
	if m.farBucket, err = substrate.New(m.farClient, substrate.Options{Name: "far"}); err != nil {
		return err
	}
	m.bucket, m.partitioned, m.faults = b, false, ""
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := engine.Open(ctx, m.options())
	if err != nil {
		b.Close()
		m.farBucket.Close()
		return err
	}
	m.e, m.open = e, map[string]*shard.Shard{}
	m.lives++
	return nil
}

// down stops m as a power loss does: its client fails every call from now on and
// its file system goes back to what was synced, keeping a share of the rest. The
// old engine closes in the background against the lost state, and its
// membership, if it had one, ends after it (see abandon).
func (w *world) down(m *machine, unsynced int) {
	m.setRules(fault.Rule{Err: errPartitioned})
	after := m.fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(w.rng.Uint64(), 1))})
	old, oldMb, oldBucket, oldFar := m.e, m.mb, m.bucket, m.farBucket
	w.dead.Go(func() {
		old.Close()
		abandon(oldMb)
		oldBucket.Close()
		oldFar.Close()
	})
	m.e, m.mb, m.open, m.fs = nil, nil, nil, after
}

func (w *world) shutdown() {
	for _, m := range w.all() {
		if m.e != nil {
			mt := m.e.Metrics()
			w.tracef("%s: %d tail objects put, %d collected, %d fences written", m.name, mt.TailPuts, mt.TailObjectsCollected, mt.FencesWritten)
			m.setRules()
			abandon(m.mb)
			m.e.Close()
			m.bucket.Close()
			m.farBucket.Close()
		}
	}
	w.dead.Wait()
	w.tails.b.Close()
}

// now is the real time since the run began, in ns: the order of calls and
// returns in the history the linearizability check reads.
func (w *world) now() int64 { return int64(time.Since(w.start)) }

// setRules gives both of m's clients the same faults.
func (m *machine) setRules(rules ...fault.Rule) {
	m.client.SetRules(rules...)
	m.farClient.SetRules(rules...)
}
