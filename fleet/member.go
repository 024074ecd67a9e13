package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

var (
	// ErrInvalidOptions reports Options that Join refuses.
	ErrInvalidOptions = errors.New("fleet: invalid options")
	// ErrCorrupt reports a fleet object that does not decode.
	ErrCorrupt = errors.New("fleet: corrupt")
	// ErrLeft reports use of a Membership after Leave.
	ErrLeft = errors.New("fleet: left")
)

// Options configure a Membership. The zero value of each field means its default,
// except Shards, which is required.
type Options struct {
	// Name is the fleet's: its leader lease and assignment are the objects
	// fleet/<Name>/leader and fleet/<Name>/assignment on the engines' authority.
	// Default "default".
	Name string
	// Weight is the member's share of the load relative to the others; 0 is 1.
	Weight float64
	// Address is what the member advertises for Route to give out: where a
	// server on it takes requests, such as "10.0.0.7:8080". Optional.
	Address string
	// Shards returns every shard to place, with its weight: the server's catalog.
	// The leader calls it before each publish; every member must see the same.
	Shards func(ctx context.Context) ([]Shard, error)
	// PollEvery is how often a member reads the assignment and the leader plans.
	// Default 1 s.
	PollEvery time.Duration
	// PublishEvery is the least time between two publishes of the assignment
	// (GCS throttles writes to one object beyond about one a second). Default 1 s.
	PublishEvery time.Duration
	// RetryEvery is how often an open of an assigned shard that its previous
	// owner still holds is tried again. Default 50 ms.
	RetryEvery time.Duration
	// DrainDeadline bounds a cooperative handoff: a revoked shard still sealing
	// after it is retired instead, and its next owner reads the rest from the
	// tail. Default 10 s.
	DrainDeadline time.Duration
	// ScanShards splits the fleet-wide background work over every stored shard
	// into this many scan shards (fnv32a of the shard id, modulo), each done by the
	// member holding its lease, fleet/<Name>/scans/<k>-of-<n>; a member holds its
	// share of them. Every member must use the same. 0, the default, scans nothing;
	// 1 is the single worker.
	ScanShards int
	// ScanEvery is the least time between the starts of two passes of one scan
	// shard. Default 1 min.
	ScanEvery time.Duration
	// ScanBackfill makes a pass copy the parts of shards nobody has open onto the
	// replicas that lack them (engine.BackfillIdle).
	ScanBackfill bool
	// ScanOrphansAfter, when set, makes a pass delete the part objects no manifest
	// names or ever will (engine.CollectOrphanParts) once they are this old.
	ScanOrphansAfter time.Duration
	// Scanned, if set, is called with each pass's result.
	Scanned func(ScanResult)
	// Revoked, if set, is called before a revoked shard's drain begins (a server
	// stops routing appends to it); Opened after a shard assigned here opened.
	Revoked func(id string)
	Opened  func(id string, sh *shard.Shard)
	// Logger receives failures of the background steps; nil discards them.
	Logger *slog.Logger
	// Registerer receives the l0_fleet_* metrics; nil registers none. Leave
	// unregisters them.
	Registerer prometheus.Registerer
}

func (o *Options) ensureDefaults() {
	if o.Name == "" {
		o.Name = "default"
	}
	if o.PollEvery == 0 {
		o.PollEvery = time.Second
	}
	if o.PublishEvery == 0 {
		o.PublishEvery = time.Second
	}
	if o.RetryEvery == 0 {
		o.RetryEvery = 50 * time.Millisecond
	}
	if o.DrainDeadline == 0 {
		o.DrainDeadline = 10 * time.Second
	}
	if o.ScanEvery == 0 {
		o.ScanEvery = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

func (o *Options) validate() error {
	switch {
	case o.Shards == nil:
		return fmt.Errorf("%w: Shards is required", ErrInvalidOptions)
	case o.Weight < 0 || math.IsNaN(o.Weight) || math.IsInf(o.Weight, 0):
		return fmt.Errorf("%w: Weight %v", ErrInvalidOptions, o.Weight)
	case o.PollEvery < 0 || o.PublishEvery < 0 || o.RetryEvery < 0 || o.DrainDeadline < 0 || o.ScanShards < 0 || o.ScanEvery < 0 || o.ScanOrphansAfter < 0:
		return fmt.Errorf("%w: %+v", ErrInvalidOptions, *o)
	case shard.ValidateID(o.Name) != nil:
		return fmt.Errorf("%w: Name %q: %w", ErrInvalidOptions, o.Name, shard.ValidateID(o.Name))
	}
	return nil
}

// Membership is an engine taking part in a fleet: it publishes itself through the
// engine's instance lease, follows the published assignment — opening the shards
// assigned to it and handing over those assigned elsewhere — and, while it holds
// the leader lease, plans and publishes the assignment. It is safe for concurrent
// use.
type Membership struct {
	e         *engine.Engine
	id        string
	bucket    *substrate.Bucket
	leaseOpts lease.Options
	clock     clock.Clock
	opts      Options
	taken0    uint64 // the engine's TailRecordsTaken at Join
	routes    routes

	// The loop's own state; leaderMu guards leader, which Stats reads too.
	leaderMu      sync.Mutex
	leader        *lease.Held
	lastPublish   time.Time
	warnedCorrupt bool
	last          published  // the assignment last followed
	claimMu       sync.Mutex // the loop and Leave both claim
	claimed       string     // the attrShards last published
	scans         scans

	mu struct {
		sync.Mutex
		open     map[string]*shard.Shard
		opening  map[string]bool
		draining map[string]bool
		assigned Assignment // as last read
		leaving  bool
		drains   []time.Duration
	}
	stats struct {
		revocations, cooperative, forced, opens, publishes, failures atomic.Uint64
	}
	wg   sync.WaitGroup // the opens and drains in flight
	stop chan struct{}
	done chan struct{}
	left atomic.Bool
}

// Join makes the engine a member of the fleet opts names, with its weight, and
// starts following the assignment. The engine must stay open until Leave returns.
func Join(ctx context.Context, e *engine.Engine, opts Options) (*Membership, error) {
	opts.ensureDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	eo := e.Options()
	leaseOpts := lease.Options{Duration: eo.Lease.Duration, SkewMargin: eo.Lease.SkewMargin, Clock: eo.Clock}
	m := &Membership{
		e: e, id: e.Instance(), bucket: e.Authority(), leaseOpts: leaseOpts,
		clock: eo.Clock, opts: opts, taken0: e.Metrics().TailRecordsTaken,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	m.mu.open = map[string]*shard.Shard{}
	m.mu.opening = map[string]bool{}
	m.mu.draining = map[string]bool{}
	m.mu.assigned = Assignment{}
	m.scans = scans{held: map[int]*lease.Held{}, last: map[int]time.Time{}, running: map[int]bool{}, results: map[int]ScanResult{}}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(collector{m}); err != nil {
			return nil, fmt.Errorf("fleet %s: register the metrics: %w", opts.Name, err)
		}
	}
	if err := e.SetAttributes(ctx, m.attrs("", false)); err != nil {
		if opts.Registerer != nil {
			opts.Registerer.Unregister(collector{m})
		}
		return nil, fmt.Errorf("fleet %s: join: %w", opts.Name, err)
	}
	go m.run()
	return m, nil
}

// attrs are the member's lease attributes, owning shards, leaving or not. The
// lease's other attributes are kept.
func (m *Membership) attrs(shards string, leaving bool) map[string]string {
	a := m.e.Attributes()
	if a == nil {
		a = map[string]string{}
	}
	a[attrFleet] = m.opts.Name
	a[attrWeight] = strconv.FormatFloat(m.opts.Weight, 'g', -1, 64)
	if m.opts.Address != "" {
		a[attrAddress] = m.opts.Address
	}
	a[attrShards] = shards
	delete(a, attrLeaving)
	if leaving {
		a[attrLeaving] = "1"
	}
	return a
}

// ID is the member's id, its engine's instance.
func (m *Membership) ID() string { return m.id }

// Shard returns the shard id if this member has it open.
func (m *Membership) Shard(id string) (*shard.Shard, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sh, ok := m.mu.open[id]
	return sh, ok
}

// Owned returns the ids of the shards this member has open, sorted.
func (m *Membership) Owned() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.mu.open))
}

// Stats are a member's counts.
type Stats struct {
	// Owned is the number of shards open here.
	Owned int
	// Leader reports whether the member holds the leader lease.
	Leader bool
	// Opens counts the shards opened because they were assigned here.
	Opens uint64
	// Revocations counts the handoffs of shards assigned elsewhere; Cooperative
	// those that sealed everything and released within DrainDeadline, Forced
	// those retired past it (or after a seal failed).
	Revocations, Cooperative, Forced uint64
	// Drains are how long each handoff took, from its start to the release.
	Drains []time.Duration
	// ReplayedRecords counts the records this member's opens read from a
	// previous owner's tail: 0 when every handoff was cooperative.
	ReplayedRecords uint64
	// Publishes counts the assignments this member published as leader;
	// Failures the background steps that failed (each logged).
	Publishes, Failures uint64
}

// Stats returns the member's counts.
func (m *Membership) Stats() Stats {
	m.mu.Lock()
	s := Stats{Owned: len(m.mu.open), Drains: slices.Clone(m.mu.drains)}
	m.mu.Unlock()
	s.Leader = m.isLeader()
	s.Opens, s.Revocations = m.stats.opens.Load(), m.stats.revocations.Load()
	s.Cooperative, s.Forced = m.stats.cooperative.Load(), m.stats.forced.Load()
	s.Publishes, s.Failures = m.stats.publishes.Load(), m.stats.failures.Load()
	s.ReplayedRecords = m.e.Metrics().TailRecordsTaken - m.taken0
	return s
}

// isLeader reports whether the member holds the leader lease now.
func (m *Membership) isLeader() bool {
	m.leaderMu.Lock()
	defer m.leaderMu.Unlock()
	if m.leader == nil {
		return false
	}
	_, err := m.leader.Valid()
	return err == nil
}

// run is the member's loop: a step every PollEvery until Leave.
func (m *Membership) run() {
	defer close(m.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-m.stop
		cancel()
	}()
	for {
		if err := m.step(ctx); err != nil && ctx.Err() == nil {
			m.stats.failures.Add(1)
			m.opts.Logger.Warn("fleet: step failed", "fleet", m.opts.Name, "member", m.id, "err", err)
		}
		select {
		case <-m.stop:
			return
		case <-m.clock.After(m.opts.PollEvery):
		}
	}
}

// step leads if it can, reads the assignment, follows it, and publishes what the
// member owns.
func (m *Membership) step(ctx context.Context) error {
	if err := m.e.Err(); errors.Is(err, engine.ErrClosed) || errors.Is(err, engine.ErrInstanceLost) {
		// The engine closed, or another process took its instance over: a
		// member no more, and no leader. (A lapsed lease is neither: the
		// member goes on, and drops the handles it fenced.)
		m.leaderMu.Lock()
		defer m.leaderMu.Unlock()
		if m.leader != nil {
			m.leader.Release(ctx)
			m.leader = nil
		}
		return nil
	}
	m.leaderMu.Lock()
	lerr := m.lead(ctx)
	m.leaderMu.Unlock()
	p, ver, err := readAssignment(ctx, m.bucket, m.opts.Name)
	switch {
	case err != nil:
		// Unreadable, or corrupt until the leader writes over it: the member
		// keeps what it has.
		p = m.last
	case ver == "" && m.last.Seq > 0:
		// Gone (deleted) after one was published: the same, until the leader
		// publishes again; taking it for "nothing placed" would close every
		// shard of the fleet.
		p = m.last
	default:
		m.last = p
		m.follow(ctx, p.Shards)
	}
	return errors.Join(lerr, err, m.claim(ctx), m.scanStep(ctx, p.Members))
}

// claim publishes the shards the member owns in its lease, when they changed. A
// shard whose handle is fenced is not claimed: another instance took it, and a
// claim of it would have the leader keep it here, where nobody serves it.
func (m *Membership) claim(ctx context.Context) error {
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	m.mu.Lock()
	var ids []string
	for id, sh := range m.mu.open {
		if !sh.Fenced() || broken.Is(broken.StaleClaim) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	owned := strings.Join(ids, ",")
	leaving := m.mu.leaving
	m.mu.Unlock()
	if owned == m.claimed && !leaving {
		return nil
	}
	if err := m.e.SetAttributes(ctx, m.attrs(owned, leaving)); err != nil {
		return fmt.Errorf("fleet %s: publish the member's shards: %w", m.opts.Name, err)
	}
	m.claimed = owned
	return nil
}

// follow opens the shards assigned here that are not open, hands over the open
// ones assigned elsewhere (or no longer placed at all), and drops those assigned
// here whose handle is fenced, to open them again.
func (m *Membership) follow(ctx context.Context, a Assignment) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.assigned = a
	for id, sh := range m.mu.open {
		// One still opening (its Opened not returned yet) is drained at the
		// next step, so that the server hears of it opened before revoked.
		if m.mu.draining[id] || m.mu.opening[id] {
			continue
		}
		if a[id] == m.id {
			if sh.Fenced() && !broken.Is(broken.StaleClaim) {
				m.mu.draining[id] = true
				m.wg.Go(func() { m.drop(id, sh) })
			}
			continue
		}
		m.mu.draining[id] = true
		m.wg.Go(func() { m.drain(id, sh, a[id] != "") })
	}
	if m.mu.leaving {
		return
	}
	for id, to := range a {
		if to != m.id || m.mu.open[id] != nil || m.mu.opening[id] || m.mu.draining[id] {
			continue
		}
		m.mu.opening[id] = true
		m.wg.Go(func() { m.open(ctx, id) })
	}
}

// leaving reports whether Leave began.
func (m *Membership) leaving() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.leaving
}

// stillAssigned reports whether id is assigned here by the last assignment read,
// and the member is not leaving.
func (m *Membership) stillAssigned(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.assigned[id] == m.id && !m.mu.leaving
}

// open opens a shard assigned here, again every RetryEvery while its previous
// owner holds it (it is draining) and it stays assigned here.
func (m *Membership) open(ctx context.Context, id string) {
	defer func() {
		m.mu.Lock()
		delete(m.mu.opening, id)
		m.mu.Unlock()
	}()
	for {
		sh, err := m.e.OpenShard(ctx, id)
		if err == nil {
			m.stats.opens.Add(1)
			m.mu.Lock()
			m.mu.open[id] = sh
			m.mu.Unlock()
			if m.opts.Opened != nil {
				m.opts.Opened(id, sh)
			}
			return
		}
		if !errors.Is(err, engine.ErrOwned) {
			m.stats.failures.Add(1)
			m.opts.Logger.Warn("fleet: open of an assigned shard failed", "fleet", m.opts.Name, "shard", id, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.clock.After(m.opts.RetryEvery):
		}
		if !m.stillAssigned(id) {
			return
		}
	}
}

// drain hands a shard over: cooperatively within DrainDeadline, else forced. A
// shard no longer placed anywhere (gone from the catalog) is closed the same way,
// and not counted as a revocation. It has a context of its own, which the end of
// the member's loop does not cut short: a drain stopped half way would leave the
// shard leased and open nowhere. One that fails all the same is given back to the
// engine, which releases it after its next renewal (engine.GiveBack). It returns
// the drain's error.
func (m *Membership) drain(id string, sh *shard.Shard, revoked bool) error {
	if m.opts.Revoked != nil {
		m.opts.Revoked(id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.drainBound())
	defer cancel()
	start := m.clock.Now()
	forced, err := sh.Drain(ctx, m.opts.DrainDeadline)
	took := m.clock.Now().Sub(start)
	if err != nil {
		m.stats.failures.Add(1)
		m.opts.Logger.Warn("fleet: handoff failed; the engine gives the shard back", "fleet", m.opts.Name, "shard", id, "forced", forced, "err", err)
		m.e.GiveBack(id)
	}
	m.mu.Lock()
	delete(m.mu.open, id)
	delete(m.mu.draining, id)
	if revoked {
		m.mu.drains = append(m.mu.drains, took)
	}
	m.mu.Unlock()
	if revoked {
		m.stats.revocations.Add(1)
		if forced {
			m.stats.forced.Add(1)
		} else if err == nil {
			m.stats.cooperative.Add(1)
		}
	}
	return err
}

// drop ends a fenced handle of a shard assigned here, so that the next step opens
// the shard again: the server stops routing to it (Revoked), and the engine lets
// go of it (its Retire fails, fenced, but ends the handle). Not a revocation.
func (m *Membership) drop(id string, sh *shard.Shard) {
	if m.opts.Revoked != nil {
		m.opts.Revoked(id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.leaseOpts.Duration)
	defer cancel()
	if err := sh.Retire(ctx); err != nil && !errors.Is(err, engine.ErrFenced) {
		m.opts.Logger.Warn("fleet: dropping a fenced shard", "fleet", m.opts.Name, "shard", id, "err", err)
	}
	m.mu.Lock()
	delete(m.mu.open, id)
	delete(m.mu.draining, id)
	m.mu.Unlock()
}

// drainBound bounds a drain: its deadline to seal, then a lease's time to ship,
// settle and release.
func (m *Membership) drainBound() time.Duration { return m.opts.DrainDeadline + m.leaseOpts.Duration }

// Leave takes the member out of the fleet: it says so in its lease, so that the
// leader assigns its shards elsewhere, hands each over as it is revoked, and
// waits until none is left or ctx ends; then it hands over (forced past
// DrainDeadline) whatever is left, each drain in its own time, gives the leader and
// scan leases up, and takes the fleet's attributes off its lease. The steps after
// ctx ended run on their own bounded contexts: a Leave cut short must still not
// leave a shard leased and open nowhere, or the leader lease held. The engine stays
// open. An error says what was not handed over or given up.
func (m *Membership) Leave(ctx context.Context) error {
	if !m.left.CompareAndSwap(false, true) {
		return ErrLeft
	}
	m.mu.Lock()
	m.mu.leaving = true
	m.mu.Unlock()
	// Each step of its own is bounded by a lease, on a context the caller's end
	// does not cut short: the handoffs before the last steps may take longer
	// than one lease, and the leader lease and attributes must still be given up.
	own := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), m.leaseOpts.Duration)
	}
	var errs []error
	cctx, cancel := own()
	err := m.claim(cctx)
	cancel()
	if err != nil {
		errs = append(errs, err)
	}
	for len(m.Owned()) > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-m.clock.After(m.opts.RetryEvery):
		}
	}
	close(m.stop)
	<-m.done
	m.wg.Wait() // the opens and drains in flight
	m.mu.Lock()
	rest := maps.Clone(m.mu.open)
	m.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, sh := range rest {
		wg.Go(func() {
			if err := m.drain(id, sh, true); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sctx, cancel := own()
	defer cancel()
	if err := m.releaseScans(sctx); err != nil {
		errs = append(errs, err)
	}
	m.leaderMu.Lock()
	if m.leader != nil {
		lctx, cancel := own()
		if err := m.leader.Release(lctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	m.leaderMu.Unlock()
	a := m.e.Attributes()
	for _, k := range []string{attrFleet, attrWeight, attrShards, attrLeaving, attrAddress} {
		delete(a, k)
	}
	actx, cancel := own()
	defer cancel()
	if err := m.e.SetAttributes(actx, a); err != nil {
		errs = append(errs, err)
	}
	if m.opts.Registerer != nil {
		m.opts.Registerer.Unregister(collector{m})
	}
	return errors.Join(errs...)
}
