package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/api/option"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/gcs"
)

// fleetMachine is a member of a bench fleet: an engine on its own Dir and its own
// client of the shared bucket, joined.
type fleetMachine struct {
	e  *engine.Engine
	m  *fleet.Membership
	b  *substrate.Bucket
	fd *fault.Driver // every call of its client goes through it
}

// fleetWorld is machines over one bucket of the remote emulator.
type fleetWorld struct {
	g      *remote
	bucket string
	root   string
	mu     sync.Mutex
	shards []fleet.Shard
	ms     []*fleetMachine
	dirs   atomic.Int64 // each machine's Dir is root/m<n>
}

func newFleetWorld(ctx context.Context, g *remote, root string, shards []fleet.Shard) (*fleetWorld, error) {
	if g.kind != "gcs" {
		return nil, fmt.Errorf("the fleet scenarios run on gcs, not %s", g.kind)
	}
	b, name, err := g.newGCSBucket(ctx) // creates the bucket
	if err != nil {
		return nil, err
	}
	b.Close()
	return &fleetWorld{g: g, bucket: name, root: root, shards: shards}, nil
}

func (w *fleetWorld) catalog(context.Context) ([]fleet.Shard, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.shards), nil
}

// join starts a machine, every object-store call of its client delayed by delay.
func (w *fleetWorld) join(ctx context.Context, delay time.Duration) (*fleetMachine, error) {
	d, err := w.driver(ctx)
	if err != nil {
		return nil, err
	}
	var rules []fault.Rule
	if delay > 0 {
		rules = append(rules, fault.Rule{Latency: delay})
	}
	fd := fault.Wrap(d, 1, rules...)
	b, err := substrate.New(fd, substrate.Options{Name: "gcs"})
	if err != nil {
		return nil, err
	}
	n := w.dirs.Add(1)
	e, err := engine.Open(ctx, engine.Options{Durability: durability, Dir: filepath.Join(w.root, fmt.Sprint("m", n)), Bucket: b})
	if err != nil {
		b.Close()
		return nil, err
	}
	m, err := fleet.Join(ctx, e, fleet.Options{Shards: w.catalog, Weight: 1})
	if err != nil {
		e.Close()
		b.Close()
		return nil, err
	}
	mc := &fleetMachine{e: e, m: m, b: b, fd: fd}
	w.mu.Lock()
	w.ms = append(w.ms, mc)
	w.mu.Unlock()
	return mc, nil
}

// driver is a client of its own of the world's bucket.
func (w *fleetWorld) driver(ctx context.Context) (*gcs.Driver, error) {
	return gcs.Open(ctx, gcs.Config{Bucket: w.bucket, Endpoint: w.g.endpoint, ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
}

func (w *fleetWorld) machines() []*fleetMachine {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ms)
}

// close makes every machine leave, then closes it.
func (w *fleetWorld) close() {
	var wg sync.WaitGroup
	for _, mc := range w.machines() {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			mc.m.Leave(ctx)
			mc.e.Close()
			mc.b.Close()
		})
	}
	wg.Wait()
	// The in-process emulator keeps what it is given: the next round's peak RSS
	// should not hold this one's objects.
	if d, err := w.driver(context.Background()); err == nil {
		if b, err := substrate.New(d, substrate.Options{Name: "gcs"}); err == nil {
			w.g.discard(context.Background(), b)
		}
	}
}

// settled waits until every shard of the catalog is open on exactly one machine and
// nothing is being handed over, for limit at most.
func (w *fleetWorld) settled(ctx context.Context, limit time.Duration, also func() bool) error {
	deadline := time.Now().Add(limit)
	for {
		shards, _ := w.catalog(ctx)
		open := map[string]int{}
		for _, mc := range w.machines() {
			for _, id := range mc.m.Owned() {
				open[id]++
			}
		}
		ok := len(open) == len(shards)
		for _, s := range shards {
			ok = ok && open[s.ID] == 1
		}
		if ok && (also == nil || also()) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the fleet did not settle in %s: %d of %d shards open", limit, len(open), len(shards))
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// fleetTotals sums the members' counts.
func (w *fleetWorld) fleetTotals() (s fleet.Stats) {
	for _, mc := range w.machines() {
		st := mc.m.Stats()
		s.Revocations += st.Revocations
		s.Cooperative += st.Cooperative
		s.Forced += st.Forced
		s.ReplayedRecords += st.ReplayedRecords
		s.Opens += st.Opens
		s.Publishes += st.Publishes
		s.Drains = append(s.Drains, st.Drains...)
	}
	return s
}

// rebalanceRound is one round of the rebalance scenario.
type rebalanceRound struct {
	JoinerShare     float64 `json:"joiner_share"` // of the appended bytes after the moves
	Ideal           float64 `json:"ideal"`
	Moved           uint64  `json:"moved"`
	Cooperative     uint64  `json:"cooperative"`
	Forced          uint64  `json:"forced"`
	ReplayedRecords uint64  `json:"replayed_records"`
	SettleSeconds   float64 `json:"settle_seconds"` // from the join to every shard open on its assignee
	drains          []time.Duration
	AppendedMB      float64 `json:"appended_mb"`
}

const (
	rebalanceShards = 64
	// rebalanceEvery paces each shard's appender: 64 shards of 1 KiB records
	// every 4 ms is 16 MB/s offered, steady whoever serves the shard.
	rebalanceEvery = 4 * time.Millisecond
)

// rebalanceScenario: one member serves 64 shards under steady appends (1 KiB
// records, one per shard every 4 ms); a second joins. Reported: the late joiner's
// share of the appends once the moves are done against its ideal share (a half),
// the shards moved, the handoffs that were forced, the records the new owner had
// to replay from a tail, and the handoffs' drain times. Targets: the share within
// 0.9 of the ideal, no handoff forced and no record replayed.
func rebalanceScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	before, after := 3*time.Second, 5*time.Second
	if cfg.quick {
		before, after = 500*time.Millisecond, time.Second
	}
	rounds := min(cfg.rounds, 3)
	prog := newProgress("rebalance", rounds)
	defer prog.done()
	var rs []rebalanceRound
	for r := range rounds {
		rr, err := rebalanceOnce(ctx, g, filepath.Join(root, fmt.Sprint("rebalance-", r)), before, after)
		if err != nil {
			return fmt.Errorf("rebalance: %w", err)
		}
		rs = append(rs, rr)
		prog.step()
	}
	var drains []time.Duration
	for _, r := range rs {
		drains = append(drains, r.drains...)
	}
	slices.Sort(drains)
	dl := summarizeLatencies(drains)
	share := each(rs, func(r rebalanceRound) float64 { return r.JoinerShare / r.Ideal })
	targets := []target{
		atLeast("rebalance: the late joiner's share of the appends over its ideal share", 0.9, share...),
		atMost("rebalance: handoffs forced", 0, each(rs, func(r rebalanceRound) float64 { return float64(r.Forced) })...),
		atMost("rebalance: records replayed from a tail by the new owners", 0, each(rs, func(r rebalanceRound) float64 { return float64(r.ReplayedRecords) })...),
	}
	title(out, "rebalance", "%d shards under steady appends (1 KiB every %s each, %.0f MB/s offered) on one member, a second joining after %s, then %s measured · %s %s · %d rounds · median (min-max)",
		rebalanceShards, rebalanceEvery, rebalanceShards*1024/rebalanceEvery.Seconds()/1e6, before, after, g.kind, g.endpoint, rounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tvalue\tideal / target\t")
	fmt.Fprintf(tw, "late joiner's share of the appends after the moves\t%s\t%s (ratio %s)\t\n",
		spreadOf(each(rs, func(r rebalanceRound) float64 { return r.JoinerShare })), num(rs[0].Ideal), spreadOf(share))
	fmt.Fprintf(tw, "shards moved\t%s\t%d\t\n", spreadOf(each(rs, func(r rebalanceRound) float64 { return float64(r.Moved) })), rebalanceShards/2)
	fmt.Fprintf(tw, "handoffs forced\t%s\t0: %s\t\n", spreadOf(each(rs, func(r rebalanceRound) float64 { return float64(r.Forced) })), verdict(targets[1]))
	fmt.Fprintf(tw, "records replayed from a tail\t%s\t0: %s\t\n", spreadOf(each(rs, func(r rebalanceRound) float64 { return float64(r.ReplayedRecords) })), verdict(targets[2]))
	fmt.Fprintf(tw, "drain ms p50 · max, %d handoffs\t%s · %s\t-\t\n", dl.Samples, cell(dl.P50Ms), num(dl.MaxMs))
	fmt.Fprintf(tw, "join → every shard open on its assignee, s\t%s\t-\t\n", spreadOf(each(rs, func(r rebalanceRound) float64 { return r.SettleSeconds })))
	fmt.Fprintf(tw, "appended while measured, MB\t%s\t-\t\n", spreadOf(each(rs, func(r rebalanceRound) float64 { return r.AppendedMB })))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n\n", targets[0])
	return emit(results, resultLine{
		Scenario: "rebalance",
		Params:   map[string]any{"shards": rebalanceShards, "before_seconds": before.Seconds(), "after_seconds": after.Seconds(), "substrate": g.kind, "record_bytes": 1024},
		Figures:  map[string]any{"rounds": rs, "drains": dl},
		Targets:  targets,
	})
}

func rebalanceOnce(ctx context.Context, g *remote, root string, before, after time.Duration) (rebalanceRound, error) {
	var shards []fleet.Shard
	for i := range rebalanceShards {
		shards = append(shards, fleet.Shard{ID: fmt.Sprintf("s%02d", i)})
	}
	w, err := newFleetWorld(ctx, g, root, shards)
	if err != nil {
		return rebalanceRound{}, err
	}
	defer w.close()
	first, err := w.join(ctx, 0)
	if err != nil {
		return rebalanceRound{}, err
	}
	if err := w.settled(ctx, time.Minute, nil); err != nil {
		return rebalanceRound{}, err
	}
	// Appenders: one per shard, paced, through whichever member has it open;
	// bytes counted per member.
	var (
		stop    atomic.Bool
		counted atomic.Bool
		wg      sync.WaitGroup
		byFirst atomic.Int64
		byOther atomic.Int64
	)
	rec := make([]byte, 1024)
	for _, s := range shards {
		wg.Go(func() {
			tick := time.NewTicker(rebalanceEvery)
			defer tick.Stop()
			for ; !stop.Load(); <-tick.C {
				var sh *shard.Shard
				var mine bool
				for _, mc := range w.machines() {
					if o, ok := mc.m.Shard(s.ID); ok {
						sh, mine = o, mc == first
					}
				}
				if sh == nil {
					continue
				}
				if _, err := sh.Append(ctx, rec); err != nil {
					continue
				}
				if counted.Load() {
					if mine {
						byFirst.Add(int64(len(rec)))
					} else {
						byOther.Add(int64(len(rec)))
					}
				}
			}
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	if err := sleep(ctx, before); err != nil {
		return rebalanceRound{}, err
	}
	base := w.fleetTotals()
	joinedAt := time.Now()
	joiner, err := w.join(ctx, 0)
	if err != nil {
		return rebalanceRound{}, err
	}
	if err := w.settled(ctx, time.Minute, func() bool { return len(joiner.m.Owned()) >= rebalanceShards/2-1 }); err != nil {
		return rebalanceRound{}, err
	}
	settle := time.Since(joinedAt)
	counted.Store(true)
	if err := sleep(ctx, after); err != nil {
		return rebalanceRound{}, err
	}
	counted.Store(false)
	t := w.fleetTotals()
	total := byFirst.Load() + byOther.Load()
	return rebalanceRound{
		JoinerShare: ratio(float64(byOther.Load()), float64(total)), Ideal: 0.5,
		Moved: t.Revocations - base.Revocations, Cooperative: t.Cooperative - base.Cooperative, Forced: t.Forced - base.Forced,
		ReplayedRecords: t.ReplayedRecords - base.ReplayedRecords, SettleSeconds: settle.Seconds(),
		drains: t.Drains[len(base.Drains):], AppendedMB: float64(total) / 1e6,
	}, nil
}

// churnFigures are the churn scenario's.
type churnFigures struct {
	Members              int     `json:"members"`
	Shards               int     `json:"shards"`
	DelayMs              float64 `json:"delay_ms"`
	Changes              int     `json:"changes"` // shards added or removed
	Revocations          uint64  `json:"revocations"`
	RevocationsPerChange float64 `json:"revocations_per_change"`
	Forced               uint64  `json:"forced"`
	Publishes            uint64  `json:"publishes"`
	Seconds              float64 `json:"seconds"`
	SettleSeconds        float64 `json:"settle_seconds"` // after the last change
}

// churnScenario: 20 members, every object-store call of each delayed 20 ms, and
// a catalog to which a shard is added and from which one is removed, in turn,
// four times a second for a minute. A balanced fleet needs no handoff for either:
// a new shard goes to the member furthest below its share, and a removed one
// leaves the others where they are. Reported: revocations per change (the anchor's
// planner made 0.89 to 4.65 per completion), forced handoffs, publishes.
func churnScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	members, shards, window, delay := 20, 200, time.Minute, 20*time.Millisecond
	if cfg.quick {
		members, shards, window = 4, 24, 2*time.Second
	}
	f, err := churnOnce(ctx, g, filepath.Join(root, "churn"), members, shards, window, delay)
	if err != nil {
		return fmt.Errorf("churn: %w", err)
	}
	targets := []target{
		atMost("churn: revocations per catalog change", 1, f.RevocationsPerChange),
		atMost("churn: handoffs forced", 0, float64(f.Forced)),
	}
	title(out, "churn", "%d members, %d shards, %s added to every object-store call, a shard added or removed every 250 ms for %s · %s %s",
		members, shards, delay, window, g.kind, g.endpoint)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tvalue\ttarget\t")
	fmt.Fprintf(tw, "catalog changes\t%d\t-\t\n", f.Changes)
	fmt.Fprintf(tw, "revocations · per change\t%d · %s\t%s\t\n", f.Revocations, num(f.RevocationsPerChange), verdict(targets[0]))
	fmt.Fprintf(tw, "handoffs forced\t%d\t%s\t\n", f.Forced, verdict(targets[1]))
	fmt.Fprintf(tw, "assignments published\t%d\t-\t\n", f.Publishes)
	fmt.Fprintf(tw, "last change → settled, s\t%s\t-\t\n", num(f.SettleSeconds))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "churn",
		Params:   map[string]any{"members": members, "shards": shards, "delay_ms": ms(delay), "window_seconds": window.Seconds(), "substrate": g.kind},
		Figures:  f,
		Targets:  targets,
	})
}

func churnOnce(ctx context.Context, g *remote, root string, members, shards int, window, delay time.Duration) (churnFigures, error) {
	var cat []fleet.Shard
	next := 0
	for ; next < shards; next++ {
		cat = append(cat, fleet.Shard{ID: fmt.Sprintf("c%05d", next)})
	}
	w, err := newFleetWorld(ctx, g, root, cat)
	if err != nil {
		return churnFigures{}, err
	}
	defer w.close()
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range members {
		wg.Go(func() {
			if _, err := w.join(ctx, delay); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return churnFigures{}, err
	}
	balanced := func() bool {
		lo, hi := shards, 0
		for _, mc := range w.machines() {
			n := len(mc.m.Owned())
			lo, hi = min(lo, n), max(hi, n)
		}
		return hi-lo <= 3
	}
	if err := w.settled(ctx, 2*time.Minute, balanced); err != nil {
		return churnFigures{}, err
	}
	base := w.fleetTotals()
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	changes := 0
	for time.Since(start) < window {
		w.mu.Lock()
		if changes%2 == 0 {
			w.shards = append(w.shards, fleet.Shard{ID: fmt.Sprintf("c%05d", next)})
			next++
		} else {
			i := rng.IntN(len(w.shards))
			w.shards = slices.Delete(w.shards, i, i+1)
		}
		w.mu.Unlock()
		changes++
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return churnFigures{}, err
		}
	}
	elapsed := time.Since(start)
	if err := w.settled(ctx, 2*time.Minute, nil); err != nil {
		return churnFigures{}, err
	}
	settle := time.Since(start) - elapsed
	t := w.fleetTotals()
	f := churnFigures{
		Members: members, Shards: shards, DelayMs: ms(delay), Changes: changes,
		Revocations: t.Revocations - base.Revocations, Forced: t.Forced - base.Forced,
		Publishes: t.Publishes - base.Publishes, Seconds: elapsed.Seconds(), SettleSeconds: settle.Seconds(),
	}
	f.RevocationsPerChange = ratio(float64(f.Revocations), float64(changes))
	return f, nil
}
