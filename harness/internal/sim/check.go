package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// oracle holds what the fleet promised, and checks every answer against it:
//   - an acknowledged record reads back, byte for byte, at its offset, exactly
//     once, on whichever machine owns the shard (once nothing of it was damaged);
//   - no offset is acknowledged, or read, with two different records;
//   - an owner whose epoch was superseded before an append began acknowledges
//     nothing;
//   - a read returns the whole history from its start, or an error: never a
//     shorter history as complete, never a record no one wrote;
//   - a takeover never finds the tail it needs gone (collection kept it), and
//     nothing reports corruption that was not injected;
//   - the history of appends and reads of each shard is linearizable.
type oracle struct {
	w       *world
	mu      sync.Mutex
	shards  map[string]*truth
	damaged map[string]bool
	history []porcupine.Operation
}

// truth is what is known of one shard.
type truth struct {
	// held are the records known durable by offset: acknowledged by an append,
	// or returned by a read (a read returns only durable records).
	held  map[uint64]held
	tried map[string]bool // every record an append offered
	// lossy is set once a Local-mode owner's unshipped records were lost to a
	// takeover; lost counts their bytes by the epoch that lost them.
	lossy bool
	lost  map[uint64]int
	// newest is the highest epoch an open returned, and when.
	newest   uint64
	newestAt int64
	// owner is the machine each epoch's open returned on.
	owner map[uint64]string
}

func newOracle(w *world) *oracle {
	return &oracle{w: w, shards: map[string]*truth{}, damaged: map[string]bool{}}
}

func (o *oracle) truth(id string) *truth {
	t := o.shards[id]
	if t == nil {
		t = &truth{held: map[uint64]held{}, tried: map[string]bool{}, lost: map[uint64]int{}, owner: map[uint64]string{}}
		o.shards[id] = t
	}
	return t
}

// The operations of the linearizability history.
type (
	appendIn struct {
		shard string
		recs  []string
	}
	appendOut struct {
		first   uint64
		outcome string // "ok", "refused" (nothing written), "unknown"
	}
	readIn struct {
		shard string
		from  uint64
	}
	readOut struct{ recs []string }
)

func (o *oracle) opened(m *machine, sh *shard.Shard, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.truth(id)
	t.owner[sh.Info().Epoch] = m.name
	if e := sh.Info().Epoch; e > t.newest {
		t.newest, t.newestAt = e, o.w.now()
	}
}

// append appends recs to shard id through m's handle sh, and reports whether it
// was acknowledged.
func (o *oracle) append(m *machine, sh *shard.Shard, id string, recs [][]byte) bool {
	strs := make([]string, len(recs))
	o.mu.Lock()
	for i, r := range recs {
		strs[i] = string(r)
		o.truth(id).tried[strs[i]] = true
	}
	o.mu.Unlock()
	epoch := sh.Info().Epoch
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	call := o.w.now()
	first, err := sh.Append(ctx, recs...)
	ret := o.w.now()

	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.truth(id)
	out := appendOut{first: first, outcome: "ok"}
	switch {
	case errors.Is(err, shard.ErrOutcomeUnknown):
		out.outcome, ret = "unknown", math.MaxInt64 // it may take effect at any time
	case err != nil:
		out.outcome = "refused"
	}
	o.history = append(o.history, porcupine.Operation{ClientId: 0, Input: appendIn{id, strs}, Call: call, Output: out, Return: ret})
	if err != nil {
		o.w.tracef("append %s on %s (%d records): %v", id, m.name, len(recs), err)
		return false
	}
	o.w.tracef("append %s on %s: %d records at %d (epoch %d)", id, m.name, len(recs), first, epoch)
	if t.newest > epoch && t.newestAt < call {
		o.w.violate("%s acknowledged %s at %d with epoch %d, after epoch %d was opened", m.name, id, first, epoch, t.newest)
	}
	for i, r := range strs {
		o.hold(id, first+uint64(i), held{r, m.mode == engine.Local, epoch, m.name}, "acknowledged by "+m.name)
	}
	return true
}

// held is a record known durable at an offset. A soft one was acknowledged, or
// read, on a Local-mode owner: it is durable on that machine, and in the history
// only once shipped, so a takeover by another machine may lose it, within the
// window the owner bounds.
type held struct {
	rec     string
	soft    bool
	epoch   uint64 // of the owner that acknowledged or read it
	machine string // that owner's
}

// mayLose reports whether epoch's owner may lack h: h is soft and, after its
// epoch, some epoch up to this one was another machine's, or came from an open
// whose answer was lost (a takeover that fenced and then failed). A machine that
// restarts, or opens again what it let go, finds its own acknowledgements in its
// WAL.
func (t *truth) mayLose(h held, epoch uint64) bool {
	if !h.soft || h.epoch >= epoch {
		return false
	}
	for e := h.epoch + 1; e <= epoch; e++ {
		if owner, ok := t.owner[e]; !ok || owner != h.machine {
			return true
		}
	}
	return false
}

// hold records that offset off of shard id durably holds h.rec.
func (o *oracle) hold(id string, off uint64, h held, how string) {
	t := o.truth(id)
	prev, ok := t.held[off]
	switch {
	case !ok:
	case prev.rec == h.rec:
		h.soft = h.soft && prev.soft
	case t.mayLose(prev, h.epoch):
		o.loseSoft(id, off, h.epoch)
	default:
		o.w.violate("%s offset %d %s as %s, but it held %s", id, off, how, short(h.rec), short(prev.rec))
		return
	}
	t.held[off] = h
}

// released records that epoch's owner of shard id released it, cooperatively:
// its acknowledgements, in Local mode too, are in the history now, and no later
// owner may lose them.
func (o *oracle) released(id string, epoch uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.truth(id)
	for k, h := range t.held {
		if h.soft && h.epoch == epoch {
			h.soft = false
			t.held[k] = h
		}
	}
}

// loseSoft drops the soft records of shard id from off on, which a later epoch
// replaced: a Local-mode owner's unshipped window, lost to a takeover. What one
// takeover loses must fit in the window the options bound.
func (o *oracle) loseSoft(id string, off, epoch uint64) {
	t := o.truth(id)
	for k, h := range t.held {
		if k >= off && t.mayLose(h, epoch) {
			delete(t.held, k)
			t.lossy = true
			t.lost[h.epoch] += len(h.rec)
			if t.lost[h.epoch] > maxUnshipped {
				o.w.violate("%s: a takeover lost %d bytes of epoch %d's Local-mode acknowledgements, over the %d-byte window", id, t.lost[h.epoch], h.epoch, maxUnshipped)
			}
		}
	}
	o.w.tracef("%s: epoch %d lost Local-mode records from %d: %d bytes of epoch's window so far", id, epoch, off, t.lost)
}

// reach is where a read through a handle of epoch must get to: past every hard
// record, and every soft one of its own epoch or that its owner cannot lack.
func (t *truth) reach(epoch uint64) uint64 {
	var end uint64
	for off, h := range t.held {
		if !h.soft || h.epoch == epoch || (h.epoch < epoch && !t.mayLose(h, epoch)) {
			end = max(end, off+1)
		}
	}
	return end
}

func (o *oracle) read(m *machine, sh *shard.Shard, id string, from uint64) {
	epoch := sh.Info().Epoch
	o.mu.Lock()
	reach := o.truth(id).reach(epoch)
	o.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	call := o.w.now()
	var (
		got []string
		err error
	)
	for rec, rerr := range sh.Read(ctx, from) {
		if rerr != nil {
			err = rerr
			break
		}
		if rec.Offset != from+uint64(len(got)) {
			err = fmt.Errorf("offset %d after %d records from %d", rec.Offset, len(got), from)
			o.mu.Lock()
			o.w.violate("read %s on %s: %v", id, m.name, err)
			o.mu.Unlock()
			return
		}
		got = append(got, string(rec.Value))
	}
	ret := o.w.now()

	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.w.tracef("read %s on %s from %d: %d records, then %v", id, m.name, from, len(got), err)
		if strings.Contains(err.Error(), "corrupt") && !o.damaged[id] {
			o.w.violate("read %s on %s reports corruption none was injected into: %v", id, m.name, err)
		}
		return
	}
	o.w.tracef("read %s on %s from %d: %d records", id, m.name, from, len(got))
	t := o.truth(id)
	for i, r := range got {
		if !t.tried[r] {
			o.w.violate("read %s on %s: offset %d holds %s, which no append wrote", id, m.name, from+uint64(i), short(r))
			return
		}
		o.hold(id, from+uint64(i), held{r, m.mode == engine.Local, epoch, m.name}, "read on "+m.name)
	}
	if end := from + uint64(len(got)); end < reach && !o.damaged[id] {
		o.w.violate("read %s on %s from %d ended at %d as complete, but %d records were durable before it began", id, m.name, from, end, reach)
	}
	o.history = append(o.history, porcupine.Operation{Input: readIn{id, from}, Call: call, Output: readOut{got}, Return: ret})
}

// damage marks the shard a corrupted object belongs to: its records may be
// unreadable from then on, though never misread.
func (o *oracle) damage(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if rest, ok := strings.CutPrefix(key, "shards/"); ok {
		o.damaged[strings.SplitN(rest, "/", 2)[0]] = true
	}
}

func isPart(key string) bool {
	rest, ok := strings.CutPrefix(key, "shards/")
	return ok && strings.Contains(rest, "/parts/")
}

func (w *world) anyDamage() bool { return len(w.o.damaged) > 0 }

// healAll ends every running machine's partition and faults.
func (w *world) healAll() {
	for _, m := range w.machines {
		if m.e != nil {
			m.setRules()
			m.partitioned, m.faults = false, ""
		}
	}
	w.tracef("heal every machine")
}

// finish heals the fleet, lets every lease run out, and reads each shard whole on
// its owner (opening it where no one has it), then checks linearizability.
func (w *world) finish() {
	w.healAll()
	for _, id := range w.shards {
		w.readWhole(id)
		if w.res.Failed() {
			return
		}
	}
	w.checkReplicated()
	if w.res.Failed() {
		return
	}
	w.checkLinearizable()
}

// checkReplicated backfills on every machine with the far replica attached, and
// then requires each of their open, undamaged shards to have every part on both
// replicas: named in the manifest, and there, whole. A seal still in flight (an
// inherited backlog's, at an open) queues its copies when it commits, so the
// check is tried again for a while before it fails: the promise is that every
// part gets there.
func (w *world) checkReplicated() {
	far, err := substrate.New(w.far, substrate.Options{Name: "far-observer"})
	if err != nil {
		w.violate("far observer: %v", err)
		return
	}
	defer far.Close()
	for _, m := range w.machines {
		if m.e == nil || !m.attached || len(m.open) == 0 {
			continue
		}
		var missing string
		for attempt := range 40 {
			if attempt > 0 {
				time.Sleep(50 * time.Millisecond)
			}
			missing = w.unreplicated(m, far)
			if missing == "" {
				break
			}
		}
		if missing != "" {
			w.violate("%s", missing)
			return
		}
	}
}

// unreplicated backfills on m and describes the first part of its shards not on
// the far replica, or returns "".
func (w *world) unreplicated(m *machine, far *substrate.Bucket) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := m.e.BackfillUnderReplicated(ctx)
	if err == nil {
		err = m.e.FlushAndWaitUploads(ctx)
	}
	w.tracef("final backfill on %s: %d parts: %v", m.name, n, errOrOK(err))
	if err != nil {
		return fmt.Sprintf("the final backfill on %s: %v", m.name, err)
	}
	for id, sh := range m.open {
		if w.o.damaged[id] {
			continue
		}
		mf, _, err := w.tails.store.Load(ctx, id)
		if err != nil {
			return fmt.Sprintf("load the manifest of %s: %v", id, err)
		}
		if mf.Epoch != sh.Info().Epoch {
			continue // another machine's since: its own set decides
		}
		for _, p := range mf.Parts {
			a, err := far.Attributes(ctx, p.Key)
			switch {
			case !slices.Contains(p.Replicas, "far"):
				return fmt.Sprintf("%s: after a backfill on %s, part %s is not on the far replica: %v", id, m.name, p.Key, p.Replicas)
			case err != nil || a.Size != p.Size:
				return fmt.Sprintf("%s: part %s, which the manifest says is on the far replica, is not there whole: %v", id, p.Key, err)
			}
		}
	}
	return ""
}

// readWhole reads shard id from 0 on its newest owner. While the owner's lease
// has lapsed (a clock jump came before its renewal) it waits for the renewal; an
// owner fenced for good closes the shard, and another machine opens it.
func (w *world) readWhole(id string) {
	for attempt := range 30 {
		var (
			owner *machine
			sh    *shard.Shard
		)
		for _, m := range w.machines {
			if s := m.open[id]; m.e != nil && s != nil && (sh == nil || s.Info().Epoch > sh.Info().Epoch) {
				owner, sh = m, s
			}
		}
		if sh == nil {
			if attempt > 0 {
				w.advance(leaseDuration + skewMargin + time.Second)
			}
			w.openShard(w.machines[attempt%len(w.machines)], id)
			continue
		}
		got, err := readAll(sh)
		if err != nil {
			w.tracef("final read %s on %s: %v", id, owner.name, err)
			if errors.Is(err, manifest.ErrLeaseExpired) {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			w.release(owner, id, "close", false)
			continue
		}
		w.checkWhole(id, owner, sh, got)
		return
	}
	if !w.o.damaged[id] {
		w.violate("shard %s could not be read whole on any machine", id)
	}
}

// readAll reads sh from 0 to its end.
func readAll(sh *shard.Shard) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []string
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			return got, err
		}
		got = append(got, string(rec.Value))
	}
	return got, nil
}

// checkWhole checks got, shard id read whole through owner's handle sh: each
// record once, and every durable offset there, as it was acknowledged or read
// (but for a Local-mode owner's window another machine's epoch may have lost).
func (w *world) checkWhole(id string, owner *machine, sh *shard.Shard, got []string) {
	w.o.mu.Lock()
	defer w.o.mu.Unlock()
	t := w.o.truth(id)
	w.tracef("final read %s on %s: %d records, %d held", id, owner.name, len(got), len(t.held))
	if w.o.damaged[id] {
		return
	}
	seen := map[string]bool{}
	for off, r := range got {
		if seen[r] {
			w.violate("final read %s: %s twice, again at %d", id, short(r), off)
			return
		}
		seen[r] = true
	}
	epoch := sh.Info().Epoch
	for off := range uint64(len(got)) {
		if h, ok := t.held[off]; ok && h.rec != got[off] && t.mayLose(h, epoch) {
			w.o.loseSoft(id, off, epoch)
		}
	}
	for off, h := range t.held {
		if off >= uint64(len(got)) && t.mayLose(h, epoch) {
			w.o.loseSoft(id, off, epoch)
		}
	}
	for off, h := range t.held {
		if off >= uint64(len(got)) {
			w.violate("final read %s on %s: durable offset %d (%s) lost: %d records", id, owner.name, off, short(h.rec), len(got))
			return
		}
		if got[off] != h.rec {
			w.violate("final read %s on %s: durable offset %d holds %s, want %s", id, owner.name, off, short(got[off]), short(h.rec))
			return
		}
	}
}

// checkLinearizable checks each undamaged shard's history of appends and reads
// against a log: an append takes the next offsets, a read returns everything from
// its start. An append of unknown outcome may take effect at any time after it
// began, or never.
func (w *world) checkLinearizable() {
	model := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			var order []string
			for _, op := range h {
				id := shardOf(op.Input)
				if w.o.damaged[id] || w.o.truth(id).lossy {
					continue
				}
				if _, ok := by[id]; !ok {
					order = append(order, id)
				}
				by[id] = append(by[id], op)
			}
			var out [][]porcupine.Operation
			for _, id := range order {
				out = append(out, by[id])
			}
			return out
		},
		Init: func() []any { return []any{""} },
		Step: func(state, input, output any) []any {
			log := state.(string)
			n := uint64(strings.Count(log, "\x00"))
			switch in := input.(type) {
			case appendIn:
				out := output.(appendOut)
				grown := log + strings.Join(in.recs, "\x00") + "\x00"
				switch out.outcome {
				case "ok":
					if out.first != n {
						return nil
					}
					return []any{grown}
				case "refused":
					return []any{log}
				default:
					return []any{log, grown}
				}
			case readIn:
				out := output.(readOut)
				recs := strings.Split(log, "\x00")
				recs = recs[:len(recs)-1]
				want := recs[min(in.from, uint64(len(recs))):] // from past the end reads nothing
				if len(want) != len(out.recs) {
					return nil
				}
				for i := range want {
					if want[i] != out.recs[i] {
						return nil
					}
				}
				return []any{log}
			}
			return nil
		},
	}
	w.o.mu.Lock()
	history := append([]porcupine.Operation(nil), w.o.history...)
	w.o.mu.Unlock()
	switch porcupine.CheckOperationsTimeout(model.ToModel(), history, 20*time.Second) {
	case porcupine.Illegal:
		w.traceIllegal(model, history)
		w.violate("the history of %d appends and reads is not linearizable", len(history))
	case porcupine.Unknown:
		w.tracef("linearizability: not decided within 20 s (%d operations)", len(history))
	default:
		w.tracef("linearizability: %d operations, linearizable", len(history))
	}
}

func shardOf(in any) string {
	switch in := in.(type) {
	case appendIn:
		return in.shard
	case readIn:
		return in.shard
	}
	return ""
}

// short names a record by its shard and number.
func short(r string) string {
	if i := strings.LastIndexByte(r, '/'); i > 0 {
		return r[:i]
	}
	return r
}

// traceIllegal writes the history of each shard that is not linearizable into
// the trace, in call order.
func (w *world) traceIllegal(model porcupine.NondeterministicModel, history []porcupine.Operation) {
	for _, part := range model.Partition(history) {
		if porcupine.CheckOperations(model.ToModel(), part) {
			continue
		}
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		w.tracef("shard %s is not linearizable; its history:", shardOf(part[0].Input))
		for _, op := range part {
			ret := "never"
			if op.Return != math.MaxInt64 {
				ret = fmt.Sprintf("%.3fs", float64(op.Return)/1e9)
			}
			switch in := op.Input.(type) {
			case appendIn:
				out := op.Output.(appendOut)
				w.tracef("  [%.3fs, %s] append %d records (%s…): %s at %d", float64(op.Call)/1e9, ret, len(in.recs), short(in.recs[0]), out.outcome, out.first)
			case readIn:
				out := op.Output.(readOut)
				names := make([]string, len(out.recs))
				for i, r := range out.recs {
					names[i] = short(r)
				}
				w.tracef("  [%.3fs, %s] read from %d: %v", float64(op.Call)/1e9, ret, in.from, names)
			}
		}
	}
}
