package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// The read-only commands on shards: shards, manifest, parts.

type shardsFlags struct {
	json bool
	skew time.Duration
}

// skewHelp describes the -skew flag of the commands that judge leases, and
// defaultSkew is its default, the engines' (engine.LeaseOptions.SkewMargin).
const (
	skewHelp    = "the engines' lease skew margin: a lease lives until its expiry plus this, by this machine's clock"
	defaultSkew = 2 * time.Second
)

var shardsCommand = &command{
	name: "shards", args: "", summary: "list the stored shards: sealed offset, parts, epoch, owner",
	help: `Every shard with a manifest on the authority, in key order, with its sealed
watermark (the offset after its last sealed record), its number of parts, the
owner epoch, the owner instance, and whether it is owned: by the owner's instance
lease as read now (owned, lapsed, released, or released with a backlog of records
that only its owner's Dir or its tail hold).
`,
	flags: func(fs *flag.FlagSet) any {
		f := &shardsFlags{}
		fs.BoolVar(&f.json, "json", false, "print JSON")
		fs.DurationVar(&f.skew, "skew", defaultSkew, skewHelp)
		return f
	},
	run: runShards, max: 0,
}

type shardRow struct {
	Shard     string `json:"shard"`
	Sealed    uint64 `json:"sealed"`
	Parts     int    `json:"parts"`
	Epoch     uint64 `json:"epoch"`
	Seq       uint64 `json:"seq"`
	Owner     string `json:"owner"`
	Ownership string `json:"ownership"`
	Error     string `json:"error,omitempty"`
}

func runShards(c *call) error {
	f := c.flags.(*shardsFlags)
	auth := c.store.Authority().Bucket
	ids, err := storedShards(c.ctx, auth)
	if err != nil {
		return err
	}
	l, err := readLeases(c.ctx, auth)
	if err != nil {
		return err
	}
	rows := make([]shardRow, 0, len(ids))
	for _, id := range ids {
		mc := loadManifest(c.ctx, auth, id)
		row := shardRow{Shard: id}
		if mc.Err != nil {
			row.Error = mc.Err.Error()
			c.damaged = true
		} else {
			m := mc.M
			row = shardRow{Shard: id, Sealed: m.Sealed, Parts: len(m.Parts), Epoch: m.Epoch, Seq: m.Seq, Owner: m.Owner, Ownership: ownership(m, l, f.skew)}
		}
		rows = append(rows, row)
	}
	if f.json {
		return writeJSON(c.stdout, rows)
	}
	tw := table(c.stdout)
	fmt.Fprintln(tw, "SHARD\tSEALED\tPARTS\tEPOCH\tOWNER\tOWNERSHIP")
	for _, r := range rows {
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tunreadable: %s\n", r.Shard, r.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", r.Shard, r.Sealed, r.Parts, r.Epoch, dash(r.Owner), r.Ownership)
	}
	return tw.Flush()
}

// dash is s, or "-" for nothing.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type jsonFlag struct{ json bool }

func jsonOnly(fs *flag.FlagSet) any {
	f := &jsonFlag{}
	fs.BoolVar(&f.json, "json", false, "print JSON")
	return f
}

var manifestCommand = &command{
	name: "manifest", args: "SHARD", summary: "the shard's manifest on every replica, side by side",
	help: `One column per replica, the authority first. Each copy is compared with the
authority's manifest, by the rules the engines' copies follow:

  in step     the authority's bytes
  absent      no copy yet
  behind      an older manifest of the authority's history
  stale       another authority's history, released with nothing of its own (a cold
              read from that replica alone)
  ahead       newer than the authority's in its own history: the authority went back
              (restored from an older copy?), or another authority took the history over
  diverged    another history, that no copy replaces: the shard had two authorities,
              or two manifests at one epoch and sequence; an operator decides which
  unreadable  the object does not decode (or could not be read)
  uncompared  the authority's manifest is unreadable: nothing to compare with

Copies run in the background after each publish: a copy absent, behind or stale is
brought to the authority's manifest by the shard's next publish (a copy that failed
as an engine closed stays behind until then). Ahead, diverged and unreadable are
damage (verify reports them).
`,
	flags: jsonOnly, run: runManifest, min: 1, max: 1,
}

func runManifest(c *call) error {
	id := c.args[0]
	auth, copies := loadManifests(c.ctx, c.store, id)
	all := append([]manifestCopy{auth}, copies...)
	if c.flags.(*jsonFlag).json {
		type out struct {
			Replica  string             `json:"replica"`
			State    state              `json:"state"`
			Why      string             `json:"why,omitempty"`
			Manifest *manifest.Manifest `json:"manifest,omitempty"`
		}
		var outs []out
		for _, mc := range all {
			o := out{Replica: mc.Replica, State: mc.State, Why: mc.Why}
			if mc.Present() {
				m := mc.M
				o.Manifest = &m
			}
			outs = append(outs, o)
		}
		return writeJSON(c.stdout, outs)
	}
	if auth.Raw == nil && auth.Err == nil {
		fmt.Fprintf(c.stdout, "shard %s: no manifest on the authority %s\n", id, auth.Replica)
	}
	tw := table(c.stdout)
	row := func(label string, cell func(mc manifestCopy) string) {
		fmt.Fprint(tw, label)
		for _, mc := range all {
			v := "-"
			if mc.Present() {
				v = cell(mc)
			}
			fmt.Fprintf(tw, "\t%s", v)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprint(tw, "REPLICA")
	for _, mc := range all {
		fmt.Fprintf(tw, "\t%s", mc.Replica)
	}
	fmt.Fprintln(tw)
	fmt.Fprint(tw, "state")
	for _, mc := range all {
		fmt.Fprintf(tw, "\t%s", mc.State)
	}
	fmt.Fprintln(tw)
	row("authority", func(mc manifestCopy) string { return dash(mc.M.Authority) })
	row("fork", func(mc manifestCopy) string {
		if f := mc.M.Fork; f != nil {
			return fmt.Sprintf("%s e%d s%d", dash(f.Authority), f.Epoch, f.Seq)
		}
		return "-"
	})
	row("epoch", func(mc manifestCopy) string { return fmt.Sprint(mc.M.Epoch) })
	row("seq", func(mc manifestCopy) string { return fmt.Sprint(mc.M.Seq) })
	row("owner", func(mc manifestCopy) string { return dash(mc.M.Owner) })
	row("lease", func(mc manifestCopy) string {
		if mc.M.Lease == "" && !mc.M.LeaseExpiry.IsZero() {
			return "until " + mc.M.LeaseExpiry.Format(time.RFC3339)
		}
		return dash(mc.M.Lease)
	})
	row("released", func(mc manifestCopy) string {
		switch {
		case mc.M.Released && mc.M.Backlog:
			return "yes, with a backlog"
		case mc.M.Released:
			return "yes"
		}
		return "no"
	})
	row("sealed", func(mc manifestCopy) string { return fmt.Sprint(mc.M.Sealed) })
	row("parts", func(mc manifestCopy) string { return fmt.Sprint(len(mc.M.Parts)) })
	row("tail", func(mc manifestCopy) string { return tailString(mc.M.Tail) })
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, mc := range all {
		if mc.Why != "" {
			fmt.Fprintf(c.stdout, "%s: %s: %s\n", mc.Replica, mc.State, mc.Why)
		}
		if mc.State.damaged() {
			c.damaged = true
		}
	}
	return nil
}

// tailString is a manifest's tail pointer in a few words.
func tailString(t *manifest.Tail) string {
	if t == nil {
		return "-"
	}
	s := fmt.Sprintf("%s on %s from %d/%d", t.Instance, t.Replica, t.Incarnation, t.From)
	if t.Until != 0 {
		inc := t.Incarnation
		if t.UntilIncarnation != 0 {
			inc = t.UntilIncarnation
		}
		s += fmt.Sprintf(" until %d/%d", inc, t.Until)
	}
	return s
}

type partsFlags struct {
	json, check bool
}

var partsCommand = &command{
	name: "parts", args: "SHARD", summary: "the shard's parts: offsets, key, size, the replicas holding each",
	help: `The parts the authority's manifest names, in offset order: first offset, next
offset (after the last record), records, the epoch that sealed it, size, the
replicas holding it, and its key. With -check (the default) each part is looked up
on every replica given (one request per part and replica): a replica the manifest
names that lacks it is marked (missing), or (size N) for another size; a replica it
does not name that holds it (unrecorded): a backfill records it. A replica the
manifest names that was not given is marked (?).
`,
	flags: func(fs *flag.FlagSet) any {
		f := &partsFlags{}
		fs.BoolVar(&f.json, "json", false, "print JSON")
		fs.BoolVar(&f.check, "check", true, "look each part up on every replica given")
		return f
	},
	run: runParts, min: 1, max: 1,
}

type partRow struct {
	manifest.Part
	Next uint64 `json:"next"`
	// Copies says, per replica, what the lookup found: "ok", "missing", "size N",
	// "unrecorded", "not given", or an error.
	Copies map[string]string `json:"copies,omitempty"`
}

func runParts(c *call) error {
	f := c.flags.(*partsFlags)
	id := c.args[0]
	mc := loadManifest(c.ctx, c.store.Authority().Bucket, id)
	if mc.Err != nil {
		return fmt.Errorf("shard %s: the authority's manifest: %w", id, mc.Err)
	}
	if mc.Raw == nil {
		return fmt.Errorf("shard %s: no manifest on the authority %s", id, mc.Replica)
	}
	rows := make([]partRow, len(mc.M.Parts))
	for i, p := range mc.M.Parts {
		rows[i] = partRow{Part: p, Next: p.Next()}
		if f.check {
			rows[i].Copies = c.lookUp(p)
		}
	}
	if f.json {
		return writeJSON(c.stdout, rows)
	}
	tw := table(c.stdout)
	fmt.Fprintln(tw, "FIRST\tNEXT\tRECORDS\tEPOCH\tSIZE\tREPLICAS\tKEY")
	for _, r := range rows {
		var reps []string
		for _, name := range r.Replicas {
			reps = append(reps, name+copyNote(r.Copies, name))
		}
		for _, name := range c.store.Names() {
			if r.Copies[name] == "unrecorded" {
				reps = append(reps, "+"+name+"(unrecorded)")
			}
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%s\t%s\n", r.First, r.Next, r.Count, r.Epoch, r.Size, dash(strings.Join(reps, ",")), r.Key)
	}
	return tw.Flush()
}

// copyNote is what to add to a replica's name for what its lookup found.
func copyNote(copies map[string]string, name string) string {
	switch v := copies[name]; v {
	case "", "ok":
		return ""
	case "not given":
		return "(?)"
	default:
		return "(" + v + ")"
	}
}

// lookUp looks part p up on every replica given, and on those its manifest
// names.
func (c *call) lookUp(p manifest.Part) map[string]string {
	out := map[string]string{}
	for _, name := range p.Replicas {
		if _, ok := c.store.Get(name); !ok {
			out[name] = "not given"
		}
	}
	for _, r := range c.store.replicas {
		attrs, err := r.Bucket.Attributes(c.ctx, p.Key)
		named := slices.Contains(p.Replicas, r.Name)
		switch {
		case errors.Is(err, substrate.ErrNotFound):
			if named {
				out[r.Name] = "missing"
			}
		case err != nil:
			out[r.Name] = err.Error()
		case !named:
			out[r.Name] = "unrecorded"
		case attrs.Size != p.Size:
			out[r.Name] = fmt.Sprintf("size %d", attrs.Size)
		default:
			out[r.Name] = "ok"
		}
	}
	return out
}
