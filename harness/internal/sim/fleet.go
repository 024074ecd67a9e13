package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// In fleet mode the machines are the members of one fleet, which places the
// shards: nothing is opened by hand but by the outsider. Appends and reads go to
// whichever member serves the shard. Members join, leave cleanly, are killed (and
// stay out until they join again), are cut off from the store and come back;
// the outsider, a machine outside the fleet, takes a shard over by hand once its
// owner's lease lapsed, appends and closes it, so that its member, fenced, is
// assigned the shard still (the stale claim). At the end every machine comes
// back, and each shard must be served by exactly one member, and take an append.

// fleetKinds are fleet mode's steps, with their weights.
var fleetKinds = []kind{
	{"burst", 44},    // appends and reads at once, on the members serving the shards
	{"join", 5},      // a machine that is out opens its engine and joins
	{"leave", 2},     // a member leaves cleanly, and its engine closes
	{"kill", 3},      // power loss: engine and membership abandoned, the machine out
	{"partition", 8}, // all of a member's object-store calls fail, or heal
	{"flaky", 3},     // slow and ambiguous object-store calls on a member, or none
	{"time", 6},      // every clock jumps past the leases
	{"tick", 6},      // every clock moves a little
	{"steal", 6},     // the outsider takes a shard over, appends, closes it
	{"blackout", 4},  // every member cut off past the leases, a shard stolen meanwhile
	{"settle", 8},    // real time passes: the fleet polls, plans, hands over
}

const (
	fleetName = "sim"
	// fleetPoll is the members' PollEvery and PublishEvery, on their clocks
	// (at the latest in real time).
	fleetPoll = 100 * time.Millisecond
	// converge bounds, in real time, how long the healed fleet has at the end
	// to serve every shard.
	converge = 30 * time.Second
	// engineRenewal is the engines' RenewEvery (see machine.options).
	engineRenewal = 500 * time.Millisecond
	// convergeTick is how far the clocks move every 50 ms of it.
	convergeTick = 200 * time.Millisecond
)

// fleetView is what the steps saw of the fleet: the assignment last traced, the
// fenced handles already counted, and the members' own reports of them.
type fleetView struct {
	seq    uint64
	names  map[string]string // instance → machine
	fenced map[string]bool   // machine/shard/epoch
	mu     sync.Mutex
	// dropped counts the fenced handles members let go of, stale those of them
	// that were of shards assigned to the member (the stale claim).
	dropped, stale int
}

// assignment is the fleet's published assignment object, as far as the
// simulation reads it.
type assignment struct {
	Seq    uint64            `json:"seq"`
	Leader string            `json:"leader"`
	Shards map[string]string `json:"shards"`
}

// startFleet switches the world to fleet mode: every machine joins, and the
// outsider's engine opens.
func (w *world) startFleet() error {
	w.kinds = fleetKinds
	w.fleet = &fleetView{names: map[string]string{}, fenced: map[string]bool{}}
	for _, m := range w.machines {
		if err := w.joinFleet(m); err != nil {
			return fmt.Errorf("%s: join: %w", m.name, err)
		}
	}
	if err := w.boot(w.outsider); err != nil {
		return fmt.Errorf("the outsider: first open: %w", err)
	}
	return nil
}

// fleetOptions are m's membership: short periods, on m's clock, each open
// recorded in the oracle, failures in the trace.
func (w *world) fleetOptions(m *machine) fleet.Options {
	shards := make([]fleet.Shard, len(w.shards))
	for i, id := range w.shards {
		shards[i] = fleet.Shard{ID: id}
	}
	instance := m.e.Instance()
	var mu sync.Mutex
	handles := map[string]*shard.Shard{}
	return fleet.Options{
		Name:      fleetName,
		Shards:    func(context.Context) ([]fleet.Shard, error) { return shards, nil },
		PollEvery: fleetPoll, PublishEvery: fleetPoll, RetryEvery: 20 * time.Millisecond,
		DrainDeadline: time.Second,
		Opened: func(id string, sh *shard.Shard) {
			mu.Lock()
			handles[id] = sh
			mu.Unlock()
			w.o.opened(m, sh, id)
			w.tracef("fleet: %s opened %s: epoch %d, next %d, sealed %d", m.name, id, sh.Info().Epoch, sh.Info().Next, sh.Info().Sealed)
		},
		Revoked: func(id string) {
			mu.Lock()
			sh := handles[id]
			delete(handles, id)
			mu.Unlock()
			if sh == nil || !sh.Fenced() {
				w.tracef("fleet: %s hands %s over", m.name, id)
				return
			}
			a, _ := w.readAssignment()
			stale := a.Shards[id] == instance
			w.fleet.mu.Lock()
			w.fleet.dropped++
			if stale {
				w.fleet.stale++
			}
			w.fleet.mu.Unlock()
			w.tracef("fleet: %s lets go of its fenced handle of %s (epoch %d); assigned to it: %v", m.name, id, sh.Info().Epoch, stale)
		},
		Logger: slog.New(slog.NewTextHandler(traceWriter{w, m.name}, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		})),
	}
}

// traceWriter writes a member's log lines into the trace.
type traceWriter struct {
	w    *world
	name string
}

func (t traceWriter) Write(p []byte) (int, error) {
	t.w.tracef("fleet: %s: %s", t.name, strings.TrimSpace(string(p)))
	return len(p), nil
}

// joinFleet makes m's engine a member.
func (w *world) joinFleet(m *machine) error {
	w.fleet.names[m.e.Instance()] = m.name
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mb, err := fleet.Join(ctx, m.e, w.fleetOptions(m))
	if err != nil {
		return err
	}
	m.mb = mb
	w.tracef("fleet: %s joins as %s", m.name, m.e.Instance())
	return nil
}

// abandon ends a membership, if there is one, whose engine is closed or about to
// close: a Leave that waits for nothing (the context is done) and hands over what
// is left.
func abandon(mb *fleet.Membership) {
	if mb == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	mb.Leave(ctx)
}

func (w *world) fleetStep(i int) {
	d := w.drawOne()
	m, id := w.machines[d.machine], w.shards[d.shard]
	switch d.kind {
	case "burst":
		w.fleetBurst(d.burst)
	case "join":
		w.join(m)
	case "leave":
		w.leave(m)
	case "kill":
		w.kill(m, id, d.n, int(d.x%3)*40)
	case "partition", "flaky", "time", "tick":
		w.machineStep(d.kind, m, d.x)
	case "steal":
		w.steal(id, d.n)
	case "blackout":
		w.blackout(id, d.n)
	case "settle":
		p := 100*time.Millisecond + time.Duration(d.x%400)*time.Millisecond
		time.Sleep(p)
		w.tracef("settle %s", p)
	}
	w.tails.check(w)
	w.watchFleet()
}

// server is a member that has a shard open, and its handle.
type server struct {
	m  *machine
	sh *shard.Shard
}

// servers are the members that have shard id open, in name order.
func (w *world) servers(id string) []server {
	var out []server
	for _, m := range w.machines {
		if m.mb == nil {
			continue
		}
		if sh, ok := m.mb.Shard(id); ok {
			out = append(out, server{m, sh})
		}
	}
	return out
}

// fleetBurst runs appends and reads at once, each on one of the members serving
// its shard (the x-th), and waits for them.
func (w *world) fleetBurst(ds []draw) {
	var wg sync.WaitGroup
	for _, d := range ds {
		id := w.shards[d.shard]
		srv := w.servers(id)
		if len(srv) == 0 {
			w.tracef("%s %s: skipped, no member serves it", d.kind, id)
			continue
		}
		s := srv[d.x%uint64(len(srv))]
		w.res.Ops++
		switch d.kind {
		case "append":
			recs := w.newRecords(id, d.n)
			wg.Go(func() { w.o.append(s.m, s.sh, id, recs) })
		case "read":
			from := (d.x >> 8) % 16
			wg.Go(func() { w.o.read(s.m, s.sh, id, from) })
		}
	}
	wg.Wait()
}

// join brings a machine that is out back: its engine opens on what its file
// system kept, and joins.
func (w *world) join(m *machine) {
	if m.e != nil {
		w.tracef("join %s: skipped, a member", m.name)
		return
	}
	w.res.Ops++
	if err := w.boot(m); err != nil {
		w.violate("%s does not reopen: %v", m.name, err)
		return
	}
	if err := w.joinFleet(m); err != nil {
		w.violate("%s does not join: %v", m.name, err)
	}
}

// leave takes a member out cleanly: Leave, bounded, then its engine closes.
func (w *world) leave(m *machine) {
	if m.mb == nil || m.partitioned {
		w.tracef("leave %s: skipped", m.name)
		return
	}
	w.res.Ops++
	owned := m.mb.Owned()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := m.mb.Leave(ctx)
	cancel()
	cerr := m.e.Close()
	m.bucket.Close()
	m.farBucket.Close()
	m.e, m.mb = nil, nil
	w.tracef("leave %s (owned %v): %v; close: %v", m.name, owned, errOrOK(err), errOrOK(cerr))
}

// kill cuts a member's power as crash does (the moment an append to shard id,
// if it serves it, is acknowledged), and leaves it out: its membership dies with
// its engine.
func (w *world) kill(m *machine, id string, n, unsynced int) {
	if m.e == nil {
		w.tracef("kill %s: skipped, out", m.name)
		return
	}
	w.res.Faults["kill"]++
	if sh, ok := m.mb.Shard(id); ok {
		w.res.Ops++
		w.o.append(m, sh, id, w.newRecords(id, n))
	}
	w.tracef("kill %s: power lost, %d%% of unsynced writes kept", m.name, unsynced)
	w.down(m, unsynced)
}

// steal has the outsider take shard id over, as an operator's tool might, with n
// records appended, and close it: it succeeds only where the owner's lease has
// lapsed (its member cut off, or its renewal behind a clock jump), and leaves
// that member with a fenced handle of a shard assigned to it.
func (w *world) steal(id string, n int) {
	x := w.outsider
	ctx, cancel := context.WithTimeout(context.Background(), 3*opTimeout)
	defer cancel()
	sh, err := x.e.OpenShard(ctx, id)
	if err != nil {
		w.tracef("steal %s: %v", id, err)
		if errors.Is(err, engine.ErrTailMissing) {
			w.violate("steal %s: the tail it needs is gone: %v", id, err)
		}
		return
	}
	w.res.Ops++
	w.res.Faults["steal"]++
	w.o.opened(x, sh, id)
	w.tracef("steal %s: epoch %d, next %d, sealed %d", id, sh.Info().Epoch, sh.Info().Next, sh.Info().Sealed)
	w.o.append(x, sh, id, w.newRecords(id, n))
	cctx, ccancel := context.WithTimeout(context.Background(), 3*opTimeout)
	defer ccancel()
	if err := sh.Close(cctx); err != nil {
		// Handed back at its next renewal; the fleet waits for it.
		w.tracef("steal %s: close: %v", id, err)
		x.e.GiveBack(id)
		return
	}
	w.o.released(id, sh.Info().Epoch)
	w.tracef("steal %s: closed", id)
}

// blackout cuts every member off from the store, lets the leases lapse, has the
// outsider steal shard id meanwhile, and heals every member: the assignment
// still names the member that served id, whose handle is fenced now. It must let
// go of it and open id again (the stale claim), not claim the fenced handle.
func (w *world) blackout(id string, n int) {
	var cut []string
	for _, m := range w.machines {
		if m.e != nil {
			m.partitioned = true
			m.setRules(fault.Rule{Err: errPartitioned})
			cut = append(cut, m.name)
		}
	}
	if len(cut) == 0 {
		w.tracef("blackout: skipped, no member")
		return
	}
	w.res.Faults["blackout"]++
	w.tracef("blackout: %v cut off from the object store", cut)
	w.advance(leaseDuration + skewMargin + time.Second)
	w.steal(id, n)
	// The members' reads of the fleet's objects come back last, once their
	// engines renewed their leases: a leader that read the members first would
	// find none live, and revoke every shard, the fenced handles too.
	for _, m := range w.machines {
		if m.e != nil {
			m.setRules(fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Key: "^fleet/", Err: errPartitioned})
			m.partitioned, m.faults = false, ""
		}
	}
	time.Sleep(2 * engineRenewal)
	for _, m := range w.machines {
		if m.e != nil {
			m.setRules()
		}
	}
	w.tracef("blackout: heal %v", cut)
	w.converge(converge/2, "the blackout")
}

// readAssignment reads the fleet's published assignment, without faults.
func (w *world) readAssignment() (assignment, error) {
	var a assignment
	data, _, err := w.tails.b.Get(context.Background(), "fleet/"+fleetName+"/assignment")
	if err != nil {
		return a, err
	}
	return a, json.Unmarshal(data, &a)
}

// name is the machine an instance is, or the instance.
func (w *world) name(instance string) string {
	if n, ok := w.fleet.names[instance]; ok {
		return n
	}
	return instance
}

// describe is an assignment in machine names.
func (w *world) describe(a assignment) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(a.Shards)) {
		parts = append(parts, id+"→"+w.name(a.Shards[id]))
	}
	return strings.Join(parts, " ")
}

// watchFleet traces each new assignment, and counts each handle found fenced
// between steps, and those the members let go of: as the stale claim, each of a
// shard assigned to its member.
func (w *world) watchFleet() {
	w.fleet.mu.Lock()
	if w.fleet.dropped > 0 {
		w.res.Faults["fenced dropped"] += w.fleet.dropped
		w.res.Faults["stale claim"] += w.fleet.stale
		w.fleet.dropped, w.fleet.stale = 0, 0
	}
	w.fleet.mu.Unlock()
	a, err := w.readAssignment()
	if err == nil && a.Seq != w.fleet.seq {
		w.fleet.seq = a.Seq
		w.tracef("fleet: assignment %d by %s: %s", a.Seq, w.name(a.Leader), w.describe(a))
	}
	for _, id := range w.shards {
		for _, s := range w.servers(id) {
			key := fmt.Sprintf("%s/%s/%d", s.m.name, id, s.sh.Info().Epoch)
			if !s.sh.Fenced() || w.fleet.fenced[key] {
				continue
			}
			w.fleet.fenced[key] = true
			w.res.Faults["fenced handle"]++
			w.tracef("fleet: %s's handle of %s (epoch %d) is fenced; assigned to it: %v", s.m.name, id, s.sh.Info().Epoch, a.Shards[id] == s.m.e.Instance())
		}
	}
}

// finishFleet heals every machine and brings back those that are out, gives the
// fleet time (real, and past the leases) to converge, and requires each shard to
// be served by exactly one member and to take an append; then it reads each shard
// whole there, and checks linearizability.
func (w *world) finishFleet() {
	w.healAll()
	for _, m := range w.machines {
		if m.e == nil {
			w.join(m)
			if w.res.Failed() {
				return
			}
		}
	}
	served := w.converge(converge, "the fleet healed")
	if w.res.Failed() {
		return
	}
	for _, id := range w.shards {
		s := served[id]
		var (
			got []string
			err error
		)
		for range 20 {
			if got, err = readAll(s.sh); err == nil {
				break
			}
			w.tracef("final read %s on %s: %v", id, s.m.name, err)
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			w.violate("shard %s, served by %s, cannot be read whole: %v", id, s.m.name, err)
			return
		}
		w.checkWhole(id, s.m, s.sh, got)
		if w.res.Failed() {
			return
		}
	}
	w.checkLinearizable()
}

// converge waits, within its bound, until every shard is served by exactly one
// member and an append to it there is acknowledged, and returns the servers. A
// shard served by nobody, or by two, at the bound is a violation. The clocks move
// on with the real time, faster, by less than a renewal period at a time: the
// leases of the engines killed lapse, while those of the live ones are renewed
// (a jump past them would have the leader plan the live members out too, and
// hide a shard stuck on one).
func (w *world) converge(bound time.Duration, after string) map[string]server {
	start := time.Now()
	lastTrace := start
	acked := map[string]server{}
	for {
		var problems []string
		for _, id := range w.shards {
			srv := w.servers(id)
			if len(srv) != 1 || srv[0].sh.Fenced() {
				delete(acked, id)
				problems = append(problems, w.unserved(id, srv))
				continue
			}
			s := srv[0]
			if a, ok := acked[id]; ok && a.sh == s.sh {
				continue
			}
			w.res.Ops++
			if w.o.append(s.m, s.sh, id, w.newRecords(id, 1)) {
				acked[id] = s
				continue
			}
			problems = append(problems, fmt.Sprintf("%s: served by %s, whose appends fail", id, s.m.name))
		}
		if len(problems) == 0 {
			w.tracef("fleet: converged in %s", time.Since(start).Round(time.Millisecond))
			return acked
		}
		if time.Since(start) > bound {
			w.violate("liveness: %s after %s: %s", time.Since(start).Round(time.Second), after, strings.Join(problems, "; "))
			return nil
		}
		if time.Since(lastTrace) > 5*time.Second {
			lastTrace = time.Now()
			w.tracef("fleet: not converged: %s", strings.Join(problems, "; "))
		}
		for _, m := range w.all() {
			m.clock.Advance(convergeTick)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unserved describes why shard id is not served by exactly one member.
func (w *world) unserved(id string, srv []server) string {
	a, _ := w.readAssignment()
	to := w.name(a.Shards[id])
	if to == "" {
		to = "nobody"
	}
	switch len(srv) {
	case 0:
		return fmt.Sprintf("%s is served by nobody (assigned to %s)", id, to)
	case 1:
		return fmt.Sprintf("%s is served only by a fenced handle on %s (assigned to %s)", id, srv[0].m.name, to)
	}
	var names []string
	for _, s := range srv {
		names = append(names, fmt.Sprintf("%s (epoch %d, fenced %v)", s.m.name, s.sh.Info().Epoch, s.sh.Fenced()))
	}
	return fmt.Sprintf("%s is served by %d members at once: %s (assigned to %s)", id, len(srv), strings.Join(names, ", "), to)
}
