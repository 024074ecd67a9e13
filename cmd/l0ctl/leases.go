package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/l0store/l0/internal/lease"
)

type leasesFlags struct {
	json bool
	skew time.Duration
}

var leasesCommand = &command{
	name: "leases", args: "", summary: "list the instance leases: holder, expiry, live or not, attributes",
	help: `Every instance lease (instances/<id>/lease on the authority): the lease each
engine holds, and every shard it owns is owned under. Its state is judged by this
machine's clock: live (until its expiry plus the skew margin), lapsed (the engine
stopped renewing it: its shards may be taken over), or released (its engine
closed, or an operator released it). Attributes are what the holder published
with it (a fleet member's fleet, weight and shards).
`,
	flags: func(fs *flag.FlagSet) any {
		f := &leasesFlags{}
		fs.BoolVar(&f.json, "json", false, "print JSON")
		fs.DurationVar(&f.skew, "skew", defaultSkew, skewHelp)
		return f
	},
	run: runLeases, max: 0,
}

type leaseRow struct {
	Instance string `json:"instance"`
	lease.Record
	State string `json:"state"`
}

func runLeases(c *call) error {
	f := c.flags.(*leasesFlags)
	l, err := readLeases(c.ctx, c.store.Authority().Bucket)
	if err != nil {
		return err
	}
	var rows []leaseRow
	for _, id := range slices.Sorted(maps.Keys(l.recs)) {
		r := l.recs[id]
		rows = append(rows, leaseRow{Instance: id, Record: r, State: leaseState(r, l.read, f.skew)})
	}
	if f.json {
		if err := writeJSON(c.stdout, rows); err != nil {
			return err
		}
	} else {
		tw := table(c.stdout)
		fmt.Fprintln(tw, "INSTANCE\tSTATE\tEXPIRY\tATTRIBUTES")
		for _, r := range rows {
			inst := r.Instance
			if r.Holder != r.Instance {
				inst += " (held by " + r.Holder + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", inst, r.State, expiry(r.Record), attrString(r.Attrs))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, key := range l.corrupt {
		fmt.Fprintf(c.stderr, "l0ctl leases: %s does not decode\n", key)
		c.damaged = true
	}
	return nil
}

// expiry is a lease's expiry as a time, or "-" when it has none (released).
func expiry(r lease.Record) string {
	if r.Expiry.IsZero() {
		return "-"
	}
	return r.Expiry.Format(time.RFC3339)
}

// attrString is a lease's attributes, sorted, as k=v pairs.
func attrString(attrs map[string]string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		kv = append(kv, k+"="+attrs[k])
	}
	return dash(strings.Join(kv, " "))
}

type leaseFlags struct {
	skew time.Duration
	scan bool
}

func (f *leaseFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.skew, "skew", defaultSkew, skewHelp)
	fs.BoolVar(&f.scan, "scan", true, "read every stored shard's manifest for the shards owned under the lease")
}

var leaseCommand = &command{
	name: "lease", args: "INSTANCE", summary: "one instance lease, and the shards owned under it",
	help: `The instance's lease record as stored (holder, token, expiry, released,
attributes, the earlier tokens a restarted engine carries), whether it lives by
this machine's clock, and, with -scan, the shards whose manifests name it: owned
while it lives.
`,
	flags: func(fs *flag.FlagSet) any {
		f := &leaseFlags{}
		f.register(fs)
		return f
	},
	run: runLease, min: 1, max: 1,
}

func runLease(c *call) error {
	f := c.flags.(*leaseFlags)
	id := c.args[0]
	b := c.store.Authority().Bucket
	at := time.Now()
	r, _, err := lease.Read(c.ctx, b, lease.InstanceKey(id))
	if err != nil {
		return err
	}
	if r.Holder == "" {
		return fmt.Errorf("no lease of instance %q on %s", id, b.Name())
	}
	tw := table(c.stdout)
	fmt.Fprintf(tw, "key\t%s\n", lease.InstanceKey(id))
	fmt.Fprintf(tw, "holder\t%s\n", r.Holder)
	fmt.Fprintf(tw, "state\t%s\n", leaseState(r, at, f.skew))
	fmt.Fprintf(tw, "expiry\t%s\n", expiry(r))
	fmt.Fprintf(tw, "token\t%s\n", r.Token)
	if len(r.Carried) > 0 {
		fmt.Fprintf(tw, "carried\t%s\n", strings.Join(r.Carried, " "))
	}
	if r.StandIn {
		fmt.Fprintf(tw, "stand-in\tyes (a reader wrote it back when it found the object gone)\n")
	}
	fmt.Fprintf(tw, "attributes\t%s\n", attrString(r.Attrs))
	if err := tw.Flush(); err != nil {
		return err
	}
	if !f.scan {
		return nil
	}
	owned, err := ownedUnder(c.ctx, c.store, id, r)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "shards owned under it: %s\n", shardList(owned))
	return nil
}

// ownedUnder returns the shards whose manifests on the authority name instance
// as their owner under one of the tokens r holds, unreleased.
func ownedUnder(ctx context.Context, s *store, instance string, r lease.Record) ([]string, error) {
	b := s.Authority().Bucket
	ids, err := storedShards(ctx, b)
	if err != nil {
		return nil, err
	}
	var owned []string
	for _, id := range ids {
		mc := loadManifest(ctx, b, id)
		if mc.Err != nil {
			continue // verify reports it
		}
		if m := mc.M; m.Owner == instance && !m.Released && r.Holds(m.Lease) {
			owned = append(owned, id)
		}
	}
	return owned, nil
}

// shardList is a list of shards, "none" for none, the first 20 and a count of the
// rest for many.
func shardList(ids []string) string {
	switch {
	case len(ids) == 0:
		return "none"
	case len(ids) > 20:
		return fmt.Sprintf("%d: %s and %d more", len(ids), strings.Join(ids[:20], ", "), len(ids)-20)
	}
	return fmt.Sprintf("%d: %s", len(ids), strings.Join(ids, ", "))
}

type releaseFlags struct {
	leaseFlags
	force bool
}

var releaseLeaseCommand = &command{
	name: "release-lease", args: "INSTANCE", summary: "release the lease of an instance whose engine is gone for good",
	help: `Writes the instance's lease released, as its engine's Close would have, for an
engine that will not come back (its machine and Dir are lost). Until its lease
runs out (30 s after its last renewal by default) nobody takes its shards; an
engine that died keeps them until then, and a lease its restarts keep carrying
(a crash loop on a lost Dir) longer. Released:

  - any engine may take each of its shards over at once: its next OpenShard (or the
    fleet's next assignment) does, reading the records its tail holds past each
    shard's sealed watermark;
  - every engine's tail collection takes the instance for dead: its tail objects
    that no shard needs any more are deleted at their next pass.

A live lease is refused: its engine may still be running, and acknowledging. With
-force it is released all the same; an engine that still runs then loses its lease
at its next renewal and stops acknowledging on every shard, and a record it
acknowledged on a shard that was taken over meanwhile, and not yet shipped to
its tail (Local durability), is lost. The write is a compare-and-swap on the
record read: a renewal in between makes it fail.
`,
	flags: func(fs *flag.FlagSet) any {
		f := &releaseFlags{}
		f.leaseFlags.register(fs)
		fs.BoolVar(&f.force, "force", false, "release the lease even if it is live")
		return f
	},
	run: runReleaseLease, min: 1, max: 1,
}

func runReleaseLease(c *call) error {
	f := c.flags.(*releaseFlags)
	id := c.args[0]
	b := c.store.Authority().Bucket
	key := lease.InstanceKey(id)
	at := time.Now()
	r, ver, err := lease.Read(c.ctx, b, key)
	if err != nil {
		return err
	}
	switch {
	case r.Holder == "":
		return fmt.Errorf("no lease of instance %q on %s", id, b.Name())
	case r.Released:
		fmt.Fprintf(c.stdout, "the lease of %s is released already: nothing to do\n", id)
		return nil
	}
	live := r.Live(at, f.skew)
	if live && !f.force {
		return fmt.Errorf("the lease of %s is live until %s (its expiry %s plus the skew margin): its engine may still be running. Stop it and wait for the lease to run out, or, if it is gone for good, pass -force",
			id, r.Expiry.Add(f.skew).Format(time.RFC3339), r.Expiry.Format(time.RFC3339))
	}
	var owned []string
	if f.scan {
		if owned, err = ownedUnder(c.ctx, c.store, id, r); err != nil {
			return err
		}
	}
	if _, err := lease.Revoke(c.ctx, b, key, ver); err != nil {
		if errors.Is(err, lease.ErrChanged) {
			return fmt.Errorf("the lease of %s was written since it was read (a renewal: its engine runs?): not released; run again to judge it anew", id)
		}
		return err
	}
	state := fmt.Sprintf("lapsed since %s", r.Expiry.Format(time.RFC3339))
	if live {
		state = fmt.Sprintf("live until %s, released with -force", r.Expiry.Format(time.RFC3339))
	}
	fmt.Fprintf(c.stdout, "released the lease of %s (%s).\n", id, state)
	if f.scan {
		fmt.Fprintf(c.stdout, "shards owned under it, which any engine may now take over at once: %s\n", shardList(owned))
	}
	fmt.Fprintf(c.stdout, "engines collect %s's tail as a dead instance's from their next collection pass: objects no shard needs go.\n", id)
	if live {
		fmt.Fprintf(c.stdout, "if %s's engine still runs, its next renewal finds the lease lost: it stops acknowledging on every shard.\n", id)
	}
	return nil
}
