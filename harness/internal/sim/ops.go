package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// kind is a kind of step and its weight in the schedule.
type kind struct {
	name   string
	weight int
}

// kinds of step, with their weights.
var kinds = []kind{
	{"burst", 48},    // appends and reads at once, on any machines
	{"open", 10},     // a machine opens a shard (a move, if another has it)
	{"seal", 5},      // a machine seals a shard it has open
	{"close", 5},     // a cooperative close: seal, release
	{"retire", 6},    // a lag move: release with the backlog in the tail
	{"crash", 4},     // power loss and restart on what was synced
	{"partition", 5}, // all of a machine's object-store calls fail, or heal
	{"flaky", 4},     // slow and ambiguous object-store calls on a machine, or none
	{"time", 6},      // every clock jumps past the leases
	{"tick", 6},      // every clock moves a little
	{"corrupt", 1},   // a byte of a part object flips
	{"attach", 2},    // a machine restarts with the far replica attached
	{"backfill", 3},  // an attached machine copies its shards' history there
}

// extras are steps drawn from a stream of their own (see extraStep), so that
// adding them left the schedule of every earlier seed as it was: each step is
// followed by one of them with the weight given, out of 100.
var extras = []struct {
	name   string
	weight int
}{
	{"fence", 6},  // a machine's tail is fenced (or twice), appends racing its next incarnation
	{"stop", 2},   // a machine's tail is fenced and the machine closes cleanly at once, then restarts
	{"zombie", 3}, // a machine's clock stops while another takes a shard of its over; it appends on
}

// draw is everything the seed decides about one step, drawn whether or not it
// applies, so that the schedule does not depend on outcomes.
type draw struct {
	kind           string
	machine, shard int
	n              int // records, or a burst's size
	x              uint64
	burst          []draw
}

func (w *world) drawOne() draw {
	d := draw{machine: w.rng.IntN(len(w.machines)), shard: w.rng.IntN(len(w.shards)), n: 1 + w.rng.IntN(4), x: w.rng.Uint64()}
	total := 0
	for _, k := range w.kinds {
		total += k.weight
	}
	r := w.rng.IntN(total)
	for _, k := range w.kinds {
		if r < k.weight {
			d.kind = k.name
			break
		}
		r -= k.weight
	}
	if d.kind == "burst" {
		d.burst = w.drawBurst(w.rng, d.n)
	}
	return d
}

// drawBurst draws the n appends and reads of a burst from rng.
func (w *world) drawBurst(rng *rand.Rand, n int) []draw {
	var out []draw
	for range n {
		b := draw{kind: "append", machine: rng.IntN(len(w.machines)), shard: rng.IntN(len(w.shards)), n: 1 + rng.IntN(3), x: rng.Uint64()}
		if b.x%4 == 0 {
			b.kind = "read"
		}
		out = append(out, b)
	}
	return out
}

// extraStep draws, from the extras' own stream, whether one follows step i, and
// runs it.
func (w *world) extraStep(i int) {
	r, m, x := w.extra.IntN(100), w.machines[w.extra.IntN(len(w.machines))], w.extra.Uint64()
	burst := w.drawBurst(w.extra, 1+w.extra.IntN(4))
	for _, k := range extras {
		if r >= k.weight {
			r -= k.weight
			continue
		}
		switch k.name {
		case "fence":
			w.fence(i, m, x, burst)
		case "stop":
			w.stop(i, m, burst)
		case "zombie":
			w.zombie(m, x, len(burst))
		}
		w.tails.check(w)
		return
	}
}

func (w *world) step(i int) {
	d := w.drawOne()
	m, id := w.machines[d.machine], w.shards[d.shard]
	switch d.kind {
	case "burst":
		w.burst(i, d.burst)
	case "open":
		w.openShard(m, id)
	case "seal":
		w.withShard(m, id, "seal", func(ctx context.Context) error {
			_, err := m.open[id].Seal(ctx, 1<<20)
			return err
		})
	case "close":
		w.release(m, id, "close", false)
	case "retire":
		w.release(m, id, "retire", true)
	case "crash":
		w.crash(m, id, d.n, int(d.x%3)*40)
	case "partition", "flaky", "time", "tick":
		w.machineStep(d.kind, m, d.x)
	case "corrupt":
		w.corrupt(d.x)
	case "attach":
		w.attach(m)
	case "backfill":
		w.backfill(m)
	}
	w.tails.check(w)
	if !w.res.Failed() {
		w.extraStep(i)
	}
}

// machineStep runs the steps both modes share: a machine's partition or its
// heal, its flaky calls, and the clocks' moves.
func (w *world) machineStep(kind string, m *machine, x uint64) {
	switch kind {
	case "partition":
		w.partition(m)
	case "flaky":
		w.flaky(m, x)
	case "time":
		w.advance(leaseDuration + skewMargin + time.Second)
	case "tick":
		w.advance(time.Duration(x%500) * time.Millisecond)
	}
}

// burst runs appends and reads at once and waits for them.
func (w *world) burst(step int, ds []draw) {
	var wg sync.WaitGroup
	for _, d := range ds {
		// An append or read goes to one of the machines that have the shard open
		// (the x-th, in name order); where none has, the drawn machine opens it.
		id := w.shards[d.shard]
		var holders []*machine
		for _, m := range w.machines {
			if m.e != nil && m.open[id] != nil {
				holders = append(holders, m)
			}
		}
		if len(holders) == 0 {
			// A third of the time: a shard left unopened for a while lets its
			// tail age, where collection could reach it.
			if d.x%3 == 0 {
				w.openShard(w.machines[d.machine], id)
			} else {
				w.tracef("%s %s: skipped, no machine has it open", d.kind, id)
			}
			continue
		}
		m := holders[d.x%uint64(len(holders))]
		sh := m.open[id]
		w.res.Ops++
		switch d.kind {
		case "append":
			recs := w.newRecords(id, d.n)
			wg.Go(func() { w.o.append(m, sh, id, recs) })
		case "read":
			from := (d.x >> 8) % 16
			wg.Go(func() { w.o.read(m, sh, id, from) })
		}
	}
	wg.Wait()
}

// newRecords names n new records of shard id: unique, so a record read back
// tells which append wrote it.
func (w *world) newRecords(id string, n int) [][]byte {
	recs := make([][]byte, n)
	for i := range recs {
		w.records++
		recs[i] = fmt.Appendf(nil, "%s/r%d/%s", id, w.records, bytes.Repeat([]byte{'.'}, w.records%300))
	}
	return recs
}

func (w *world) openShard(m *machine, id string) {
	if m.e == nil || m.open[id] != nil {
		w.tracef("open %s on %s: skipped", id, m.name)
		return
	}
	w.res.Ops++
	ctx, cancel := context.WithTimeout(context.Background(), 3*opTimeout)
	defer cancel()
	sh, err := m.e.OpenShard(ctx, id)
	if err != nil {
		w.tracef("open %s on %s: %v", id, m.name, err)
		if errors.Is(err, engine.ErrTailMissing) && !w.o.damaged[id] {
			w.violate("open %s on %s: the tail it needs is gone: %v", id, m.name, err)
		}
		return
	}
	m.open[id] = sh
	w.o.opened(m, sh, id)
	w.tracef("open %s on %s: epoch %d, next %d, sealed %d", id, m.name, sh.Info().Epoch, sh.Info().Next, sh.Info().Sealed)
}

// withShard runs an operation on a shard m has open.
func (w *world) withShard(m *machine, id, what string, f func(ctx context.Context) error) {
	if m.e == nil || m.open[id] == nil {
		w.tracef("%s %s on %s: skipped, not open", what, id, m.name)
		return
	}
	w.res.Ops++
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := f(ctx)
	w.tracef("%s %s on %s: %v", what, id, m.name, errOrOK(err))
}

func (w *world) release(m *machine, id, what string, retire bool) {
	w.withShard(m, id, what, func(ctx context.Context) error {
		sh := m.open[id]
		delete(m.open, id) // closed or not, the handle is done
		var err error
		if retire {
			err = sh.Retire(ctx)
		} else {
			err = sh.Close(ctx)
		}
		if err == nil {
			// Released: what it acknowledged is sealed or shipped, its end
			// recorded, in Local mode too.
			w.o.released(id, sh.Info().Epoch)
		}
		return err
	})
}

// crash cuts m's power. Where m has shard id open, the power goes the moment an
// append of n records to it is acknowledged, before anything else runs on the
// machine: an acknowledgement given before its write was synced has only the
// rest of that sync to be lost in, and a power loss between two steps would
// almost never fall there.
func (w *world) crash(m *machine, id string, n, unsynced int) {
	if m.e == nil {
		return
	}
	w.res.Faults["crash"]++
	if sh := m.open[id]; sh != nil {
		w.res.Ops++
		w.o.append(m, sh, id, w.newRecords(id, n))
	}
	w.tracef("crash %s: power lost, %d%% of unsynced writes kept", m.name, unsynced)
	w.down(m, unsynced)
	if err := w.boot(m); err != nil {
		w.tracef("restart %s: %v", m.name, err)
		if !errors.Is(err, engine.ErrTailMissing) || !w.anyDamage() {
			w.violate("%s does not reopen after a power loss: %v", m.name, err)
		}
		return
	}
	w.tracef("restart %s: up", m.name)
}

func (w *world) partition(m *machine) {
	if m.e == nil {
		return
	}
	m.partitioned = !m.partitioned
	if m.partitioned {
		w.res.Faults["partition"]++
		m.setRules(fault.Rule{Err: errPartitioned})
		w.tracef("partition %s from the object store", m.name)
		return
	}
	m.setRules()
	m.faults = ""
	w.tracef("heal %s", m.name)
}

// flaky makes a third of m's calls slow, a tenth of its writes ambiguous (done,
// reported failed), or heals it.
func (w *world) flaky(m *machine, x uint64) {
	if m.e == nil || m.partitioned {
		return
	}
	writes := []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap, substrate.OpDelete}
	switch x % 3 {
	case 0:
		m.faults = "slow"
		m.setRules(fault.Rule{Probability: 0.3, Latency: 20 * time.Millisecond})
	case 1:
		m.faults = "ambiguous"
		m.setRules(fault.Rule{Ops: writes, Probability: 0.1, Err: errors.New("sim: lost reply"), Ambiguous: true})
	default:
		m.faults = ""
		m.setRules()
	}
	if m.faults != "" {
		w.res.Faults[m.faults]++
	}
	w.tracef("%s calls: %q", m.name, m.faults)
}

// advance moves every clock by d, together: their skews stay within the margin.
func (w *world) advance(d time.Duration) {
	if d >= leaseDuration {
		w.res.Faults["lease expiry"]++
	}
	for _, m := range w.all() {
		m.clock.Advance(d)
	}
	w.tracef("clocks +%s", d)
}

// corrupt flips a byte of one of the store's part objects.
func (w *world) corrupt(x uint64) {
	ctx := context.Background()
	b := w.tails.b // the store, without faults
	var keys []string
	for a, err := range b.ListAll(ctx, "") {
		if err == nil && a.Size > 0 && isPart(a.Key) {
			keys = append(keys, a.Key)
		}
	}
	if len(keys) == 0 {
		w.tracef("corrupt: no part yet")
		return
	}
	key := keys[x%uint64(len(keys))]
	data, _, err := b.Get(ctx, key)
	if err != nil {
		w.tracef("corrupt %s: %v", key, err)
		return
	}
	data[int(x>>8)%len(data)] ^= 0x5a
	if _, err := b.Put(ctx, key, bytes.NewReader(data)); err != nil {
		w.tracef("corrupt %s: %v", key, err)
		return
	}
	w.res.Faults["corrupt"]++
	w.o.damage(key)
	w.tracef("corrupt %s", key)
}

// attach restarts m with the far replica: a cooperative close, then an open
// with the longer replica list.
func (w *world) attach(m *machine) {
	if m.e == nil || m.attached || m.partitioned {
		return
	}
	w.res.Ops++
	err := m.e.Close()
	m.bucket.Close()
	m.farBucket.Close()
	m.e, m.open, m.attached = nil, nil, true
	w.tracef("attach the far replica to %s: close: %v", m.name, errOrOK(err))
	if err := w.boot(m); err != nil {
		w.violate("%s does not reopen with the far replica: %v", m.name, err)
	}
}

// backfill copies the parts of m's open shards that the far replica lacks.
func (w *world) backfill(m *machine) {
	if m.e == nil || !m.attached {
		return
	}
	w.res.Ops++
	ctx, cancel := context.WithTimeout(context.Background(), 3*opTimeout)
	defer cancel()
	n, err := m.e.BackfillUnderReplicated(ctx)
	if err == nil {
		err = m.e.FlushAndWaitUploads(ctx)
	}
	w.tracef("backfill on %s: %d parts queued: %v", m.name, n, errOrOK(err))
}

// fenceTail fences m's live tail incarnation from outside, as a takeover of
// another of its shards does (without the mark: no shard of m's is taken); twice
// puts a fence at the start of the incarnation after it too, so that the next
// one starts and is fenced at once. It reports whether it fenced anything.
func (w *world) fenceTail(m *machine, twice bool) bool {
	if m.e == nil {
		return false
	}
	ctx := context.Background()
	inst := m.e.Instance()
	c, _, err := tail.ReadChain(ctx, w.tails.b, inst)
	live, ok := c.Live()
	if err != nil || !ok {
		w.tracef("fence %s's tail: no live incarnation (%v)", m.name, errOrOK(err))
		return false
	}
	at, _, err := tail.Fence(ctx, w.tails.b, inst, live.N, 0)
	if err != nil {
		w.tracef("fence %s's tail: %v", m.name, err)
		return false
	}
	w.res.Faults["fence"]++
	w.tracef("fence %s's tail incarnation %d at %d", m.name, live.N, at)
	if twice {
		if _, _, err := tail.Fence(ctx, w.tails.b, inst, live.N+1, 0); err == nil {
			w.res.Faults["fence twice"]++
			w.tracef("fence %s's tail incarnation %d at 0, before it starts", m.name, live.N+1)
		}
	}
	return true
}

// fence fences m's tail and runs a burst of appends and reads at once, racing
// the next incarnation's start.
func (w *world) fence(step int, m *machine, x uint64, ds []draw) {
	if !w.fenceTail(m, x%2 == 1) {
		return
	}
	w.burst(step, ds)
}

// stop fences m's tail and closes m's engine cleanly while its next incarnation
// starts and a burst of appends runs, then opens it again.
func (w *world) stop(step int, m *machine, ds []draw) {
	if m.partitioned || !w.fenceTail(m, false) {
		return
	}
	w.res.Ops++
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.burst(step, ds)
	}()
	time.Sleep(time.Millisecond)
	held := maps.Clone(m.open)
	err := m.e.Close()
	<-done
	w.tracef("stop %s cleanly: %v", m.name, errOrOK(err))
	if err == nil {
		// Every shard it had open retired: what it acknowledged is in the
		// history now, in Local mode too.
		for id, sh := range held {
			w.o.released(id, sh.Info().Epoch)
		}
	}
	m.bucket.Close()
	m.farBucket.Close()
	m.e, m.open = nil, nil
	if err := w.boot(m); err != nil {
		w.violate("%s does not reopen after a clean close: %v", m.name, err)
	}
}

// zombie stops m's clock while every other clock runs past the leases, lets
// another machine take over one of m's shards, and has m append to it at once,
// believing its lease still holds, before its clock catches up. Only the fence
// of m's tail that the takeover writes keeps those appends from being
// acknowledged where the new owner never reads: a zombie's clock is exactly
// what a lease cannot rule out. Only a Remote-mode machine: a Local-mode one
// acknowledges on its own sync, and rests on the lease's clock bound for that.
func (w *world) zombie(m *machine, x uint64, n int) {
	if m.e == nil || m.mode != engine.Remote || m.partitioned || len(m.open) == 0 {
		return
	}
	ids := slices.Sorted(maps.Keys(m.open))
	id := ids[x%uint64(len(ids))]
	var others []*machine
	for _, o := range w.machines {
		if o != m && o.e != nil && !o.partitioned && o.open[id] == nil {
			others = append(others, o)
		}
	}
	if len(others) == 0 {
		return
	}
	o := others[(x>>8)%uint64(len(others))]
	w.res.Faults["zombie"]++
	d := leaseDuration + skewMargin + time.Second
	for _, c := range w.machines {
		if c != m {
			c.clock.Advance(d)
		}
	}
	w.tracef("clocks +%s but %s's: it is a zombie", d, m.name)
	w.openShard(o, id)
	sh := m.open[id]
	var wg sync.WaitGroup
	for range 1 + n%3 {
		recs := w.newRecords(id, 1+n%2)
		w.res.Ops++
		wg.Go(func() { w.o.append(m, sh, id, recs) })
	}
	wg.Wait()
	m.clock.Advance(d)
	w.tracef("%s's clock catches up", m.name)
}

func errOrOK(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
