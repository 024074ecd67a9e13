package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
)

var tailCommand = &command{
	name: "tail", args: "SHARD", summary: "the tail objects the shard's manifest needs, and whether they are there",
	help: `A shard's records past its sealed watermark are in the tail of the instance that
owned it, on one replica: the manifest's tail pointer names the replica, the
instance, and the incarnation and sequence from which its stream holds them;
they go on through every later incarnation the instance's chain lists
(instances/<id>/tail-chain), each to its end, or to the end a release recorded
(until). For each incarnation this lists the sequences the pointer covers, the
objects and fences there, and any sequence missing where one must be: below the
first object they were collected (nothing needed them), but from there on every
sequence up to the end holds an object. Then it reads the shard's records from
the sealed watermark on, as a takeover would, without fencing or marking
anything.
`,
	run: runTail, min: 1, max: 1,
}

// tailSpan is the part of one incarnation's stream a pointer covers.
type tailSpan struct {
	Incarnation uint64
	From        uint64
	Until       uint64 // tail.NoFence: to the stream's end
	End         string // what ends it: the release's until, the chain's end, or live
	Objects     int
	Fences      int
	First, Last uint64 // the sequences of the first and last object (or fence) found
	Missing     []uint64
}

// tailReport is what reading a shard's tail found.
type tailReport struct {
	Pointer *manifest.Tail
	Given   bool // the pointer's replica is one of the store's
	Chain   tail.Chain
	Spans   []tailSpan
	Records int
	// Damage says what is wrong; Notes what could not be checked.
	Damage, Notes []string
}

// readTail reads the tail m points at, without writing: the spans of each
// incarnation it covers, and the shard's records past the sealed watermark
// (tail.ReadHistory, without its takeover's mark and fence).
func readTail(ctx context.Context, s *store, m manifest.Manifest) tailReport {
	r := tailReport{Pointer: m.Tail}
	t := m.Tail
	if t == nil {
		if m.Released && m.Backlog {
			r.Notes = append(r.Notes, "released with a backlog and no tail pointer: only an open on its owner's Dir has those records")
		}
		return r
	}
	rep, ok := s.Get(t.Replica)
	if !ok {
		r.Notes = append(r.Notes, fmt.Sprintf("the tail is on replica %s, which was not given (-replica %s=URL)", t.Replica, t.Replica))
		return r
	}
	r.Given = true
	b := rep.Bucket
	p := tail.PointerOf(t)
	released := p.Until != (tail.Position{})
	if released && p.Until.Incarnation == p.From.Incarnation {
		r.Spans = []tailSpan{{Incarnation: p.From.Incarnation, From: p.From.Sequence, Until: p.Until.Sequence, End: "until"}}
	} else {
		c, _, err := tail.ReadChain(ctx, b, t.Instance)
		if err != nil {
			r.Damage = append(r.Damage, fmt.Sprintf("the chain of %s on %s: %v", t.Instance, t.Replica, err))
			return r
		}
		r.Chain = c
		incs := c.From(p.From.Incarnation)
		if len(incs) == 0 || incs[0].N != p.From.Incarnation {
			incs = []tail.Incarnation{{N: p.From.Incarnation}} // not listed: read to its fence
		}
		for _, inc := range incs {
			if released && inc.N > p.Until.Incarnation {
				break
			}
			sp := tailSpan{Incarnation: inc.N, Until: tail.NoFence, End: "live"}
			if inc.N == p.From.Incarnation {
				sp.From = p.From.Sequence
			}
			switch {
			case released && inc.N == p.Until.Incarnation:
				sp.Until, sp.End = p.Until.Sequence, "until"
			case inc.Ended:
				sp.Until, sp.End = inc.End, "ended"
			}
			r.Spans = append(r.Spans, sp)
		}
	}
	for i := range r.Spans {
		if err := listSpan(ctx, s, t, &r.Spans[i]); err != nil {
			r.Damage = append(r.Damage, err.Error())
		}
		if sp := r.Spans[i]; len(sp.Missing) > 0 {
			r.Damage = append(r.Damage, fmt.Sprintf("incarnation %d of %s on %s: sequences missing: %s", sp.Incarnation, t.Instance, t.Replica, seqList(sp.Missing)))
		}
	}
	h, err := tail.ReadHistory(ctx, b, p, m.Shard, m.Epoch, m.Sealed, tail.HistoryOptions{})
	switch {
	case err != nil:
		r.Damage = append(r.Damage, fmt.Sprintf("reading the records past the sealed watermark %d: %v", m.Sealed, err))
	case len(h.Records) == 0 && m.Released && m.Backlog && released:
		// A release with a backlog shipped the records it left, and recorded
		// where they end: they are in the tail, or they are lost.
		r.Damage = append(r.Damage, fmt.Sprintf("released with a backlog past the sealed watermark %d, and the tail holds none of it", m.Sealed))
	}
	r.Records = len(h.Records)
	return r
}

// listSpan lists the objects of one span and finds the sequences missing: from
// the first object found, every sequence up to the span's end must hold an object
// or a fence (a stream is written in order, and collection deletes only its
// start).
func listSpan(ctx context.Context, s *store, t *manifest.Tail, sp *tailSpan) error {
	b, _ := s.Get(t.Replica)
	next, found := uint64(0), false
	for o, err := range tail.Objects(ctx, b.Bucket, t.Instance, sp.Incarnation, sp.From) {
		if err != nil {
			return fmt.Errorf("list incarnation %d of %s on %s: %w", sp.Incarnation, t.Instance, t.Replica, err)
		}
		if sp.Until != tail.NoFence && o.Sequence >= sp.Until {
			break
		}
		if !found {
			sp.First, found = o.Sequence, true
		} else {
			for q := next; q < o.Sequence && len(sp.Missing) < 100; q++ {
				sp.Missing = append(sp.Missing, q)
			}
		}
		if o.Size == 0 {
			sp.Fences++
		} else {
			sp.Objects++
		}
		sp.Last, next = o.Sequence, o.Sequence+1
		if o.Size == 0 && sp.Until == tail.NoFence {
			break // a live stream ends at its first fence
		}
	}
	if found && sp.Until != tail.NoFence {
		for q := next; q < sp.Until && len(sp.Missing) < 100; q++ {
			sp.Missing = append(sp.Missing, q)
		}
	}
	return nil
}

// seqList is a list of sequences, ranges collapsed.
func seqList(seqs []uint64) string {
	var parts []string
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(seqs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", seqs[i], seqs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func runTail(c *call) error {
	id := c.args[0]
	mc := loadManifest(c.ctx, c.store.Authority().Bucket, id)
	if mc.Err != nil {
		return fmt.Errorf("shard %s: the authority's manifest: %w", id, mc.Err)
	}
	if mc.Raw == nil {
		return fmt.Errorf("shard %s: no manifest on the authority %s", id, mc.Replica)
	}
	m := mc.M
	fmt.Fprintf(c.stdout, "shard %s: epoch %d, sealed %d, owner %s", id, m.Epoch, m.Sealed, dash(m.Owner))
	switch {
	case m.Released && m.Backlog:
		fmt.Fprint(c.stdout, ", released with a backlog")
	case m.Released:
		fmt.Fprint(c.stdout, ", released")
	}
	fmt.Fprintln(c.stdout)
	if m.Tail == nil {
		fmt.Fprintln(c.stdout, "tail: none (no records past the sealed watermark are in a tail)")
	} else {
		fmt.Fprintf(c.stdout, "tail: %s\n", tailString(m.Tail))
	}
	r := readTail(c.ctx, c.store, m)
	if len(r.Chain.Incarnations) > 0 {
		var incs []string
		for _, inc := range r.Chain.Incarnations {
			if inc.Ended {
				incs = append(incs, fmt.Sprintf("%d (ended at %d)", inc.N, inc.End))
			} else {
				incs = append(incs, fmt.Sprintf("%d (live)", inc.N))
			}
		}
		fmt.Fprintf(c.stdout, "chain of %s: incarnations %s\n", m.Tail.Instance, strings.Join(incs, ", "))
	}
	if len(r.Spans) > 0 {
		tw := table(c.stdout)
		fmt.Fprintln(tw, "INCARNATION\tFROM\tTO\tOBJECTS\tFENCES\tMISSING")
		for _, sp := range r.Spans {
			to := sp.End
			if sp.Until != tail.NoFence {
				to = fmt.Sprintf("%d (%s)", sp.Until, sp.End)
			}
			missing := "-"
			if len(sp.Missing) > 0 {
				missing = seqList(sp.Missing)
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%s\n", sp.Incarnation, sp.From, to, sp.Objects, sp.Fences, missing)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if r.Given {
		if r.Records > 0 {
			fmt.Fprintf(c.stdout, "records past the sealed watermark in the tail: %d (offsets %d to %d)\n", r.Records, m.Sealed, m.Sealed+uint64(r.Records)-1)
		} else {
			fmt.Fprintln(c.stdout, "records past the sealed watermark in the tail: none")
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(c.stdout, "note: %s\n", n)
	}
	for _, d := range r.Damage {
		fmt.Fprintf(c.stdout, "DAMAGE: %s\n", d)
		c.damaged = true
	}
	return nil
}
