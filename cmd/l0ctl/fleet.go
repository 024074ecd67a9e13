package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/internal/lease"
)

type fleetFlags struct {
	json bool
	skew time.Duration
}

var fleetCommand = &command{
	name: "fleet", args: "[NAME]", summary: "a fleet's members, leader and assignment, as stored",
	help: `A fleet is stored as objects on the authority: its leader lease
(fleet/<name>/leader), the assignment the leader last published
(fleet/<name>/assignment: which member each shard is assigned to), and its
members' instance leases, whose attributes carry the fleet's name, the member's
weight and the shards it owns. This shows them: each member with its lease's
state by this machine's clock (a member is one while its lease lives), its
weight, the shards it says it owns and the shards assigned to it; then each
assigned shard whose owner is not its assignee (a handoff in progress, or one
stuck). With no NAME, every fleet found.
`,
	flags: func(fs *flag.FlagSet) any {
		f := &fleetFlags{}
		fs.BoolVar(&f.json, "json", false, "print JSON")
		fs.DurationVar(&f.skew, "skew", defaultSkew, skewHelp)
		return f
	},
	run: runFleet, max: 1,
}

func runFleet(c *call) error {
	f := c.flags.(*fleetFlags)
	b := c.store.Authority().Bucket
	names := c.args
	if len(names) == 0 {
		var err error
		if names, err = fleet.StoredNames(c.ctx, b); err != nil {
			return err
		}
		if len(names) == 0 {
			fmt.Fprintln(c.stdout, "no fleet")
			return nil
		}
	}
	var all []fleet.Stored
	for i, name := range names {
		at := time.Now()
		st, err := fleet.ReadStored(c.ctx, b, name)
		if errors.Is(err, fleet.ErrCorrupt) {
			fmt.Fprintf(c.stderr, "l0ctl fleet: %v\n", err)
			c.damaged = true
		} else if err != nil {
			return err
		}
		if f.json {
			all = append(all, st)
			continue
		}
		if i > 0 {
			fmt.Fprintln(c.stdout)
		}
		printFleet(c, st, at, f.skew)
	}
	if f.json {
		return writeJSON(c.stdout, all)
	}
	return nil
}

func printFleet(c *call, st fleet.Stored, at time.Time, skew time.Duration) {
	w := c.stdout
	fmt.Fprintf(w, "fleet %s\n", st.Name)
	if st.Leader.Holder != "" {
		fmt.Fprintf(w, "leader: %s (lease %s)\n", st.Leader.Holder, leaseState(storedRecord(st.Leader), at, skew))
	} else {
		fmt.Fprintln(w, "leader: none")
	}
	if st.Seq == 0 {
		fmt.Fprintln(w, "assignment: none published")
	} else {
		fmt.Fprintf(w, "assignment: publish %d, by %s, for members %s\n", st.Seq, st.Publisher, dash(strings.Join(st.Planned, ", ")))
	}
	assigned := map[string][]string{}
	for _, id := range slices.Sorted(maps.Keys(st.Assignment)) {
		m := st.Assignment[id]
		assigned[m] = append(assigned[m], id)
	}
	tw := table(w)
	fmt.Fprintln(tw, "MEMBER\tLEASE\tWEIGHT\tOWNS\tASSIGNED")
	owner := map[string]string{}
	seen := map[string]bool{}
	for _, m := range st.Members {
		state := leaseState(storedRecord(m.Lease), at, skew)
		if m.Leaving {
			state += ", leaving"
		}
		live := m.Lease.Live(at, skew)
		for _, id := range m.Shards {
			if live {
				owner[id] = m.ID
			}
		}
		seen[m.ID] = true
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.ID, state, strconv.FormatFloat(m.Weight, 'g', -1, 64),
			countList(m.Shards), countList(assigned[m.ID]))
	}
	// A shard may be assigned to an instance that no longer names the fleet.
	for _, id := range slices.Sorted(maps.Keys(assigned)) {
		if !seen[id] {
			fmt.Fprintf(tw, "%s\tnot a member\t-\t-\t%s\n", id, countList(assigned[id]))
		}
	}
	tw.Flush()
	var moving []string
	for _, id := range slices.Sorted(maps.Keys(st.Assignment)) {
		if o := owner[id]; o != "" && o != st.Assignment[id] {
			moving = append(moving, fmt.Sprintf("%s (owned by %s, assigned to %s)", id, o, st.Assignment[id]))
		}
	}
	if len(moving) > 0 {
		fmt.Fprintf(w, "moving: %s\n", strings.Join(moving, "; "))
	}
}

// countList is a count and the items, the first 10 of many.
func countList(ids []string) string {
	switch {
	case len(ids) == 0:
		return "0"
	case len(ids) > 10:
		return fmt.Sprintf("%d: %s ...", len(ids), strings.Join(ids[:10], ","))
	}
	return fmt.Sprintf("%d: %s", len(ids), strings.Join(ids, ","))
}

// storedRecord is a fleet's stored lease as the lease package reads one.
func storedRecord(l fleet.StoredLease) lease.Record {
	return lease.Record{Holder: l.Holder, Expiry: l.Expiry, Released: l.Released, Attrs: l.Attrs}
}
