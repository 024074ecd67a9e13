package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
)

type backfillFlags struct {
	instance string
}

var backfillCommand = &command{
	name: "backfill", args: "[SHARD...]", summary: "copy the parts the replicas lack, of shards nobody owns",
	help: `Copies each part of the named shards (or of every stored shard) onto the
replicas given that lack it, and records the copies in the shard's manifest:
after a replica was attached, or a copy failed for good. It is the engines' own
backfill (engine.BackfillIdle, what a fleet's scan with ScanBackfill runs): l0ctl
opens an engine of its own on the replicas given, under the instance name
-instance and in a temporary directory, takes each shard over that was released
with nothing left unsealed and lacks a copy, copies its parts from the first
replica (in the order given) that holds each, and closes it again; then it closes
the engine, which releases its lease.

A shard that is not released is left alone: the engine that has it open copies
its parts itself (Options.BackfillOnOpen, Engine.BackfillUnderReplicated), and one
whose engine is gone is backfilled once another engine took it over and closed it
(any OpenShard may, once the owner's lease ran out, or was released with
release-lease). So is a shard released with a backlog of unsealed records, which
the next open seals. Give every replica of the store, in the engines' order: a
part is copied to every replica given that its manifest does not name.
`,
	flags: func(fs *flag.FlagSet) any {
		f := &backfillFlags{}
		fs.StringVar(&f.instance, "instance", "l0ctl", "the instance name l0ctl's engine takes leases as: no engine of the store's may use it, and no two l0ctl backfills at once")
		return f
	},
	run: runBackfill, max: -1,
}

func runBackfill(c *call) error {
	f := c.flags.(*backfillFlags)
	if len(c.store.replicas) < 2 {
		return usageErrorf("one replica given: a backfill copies between two or more")
	}
	ids, err := c.shardArgs()
	if err != nil {
		return err
	}
	l, err := readLeases(c.ctx, c.store.Authority().Bucket)
	if err != nil {
		return err
	}
	// What to do, read before the engine opens: the shards to leave, and why.
	var todo []string
	short := map[string]int{} // the copies each shard to backfill lacks
	for _, id := range ids {
		mc := loadManifest(c.ctx, c.store.Authority().Bucket, id)
		m := mc.M
		switch {
		case mc.Err != nil:
			fmt.Fprintf(c.stdout, "%s: not backfilled: its manifest: %v\n", id, mc.Err)
			c.damaged = true
		case mc.Raw == nil:
			fmt.Fprintf(c.stdout, "%s: not backfilled: no manifest on the authority\n", id)
			c.damaged = true
		case missingCopies(c.store, m.Parts) == 0:
			fmt.Fprintf(c.stdout, "%s: every part is on every replica given\n", id)
		case !m.Released:
			fmt.Fprintf(c.stdout, "%s: not backfilled: not released (%s by %s): an engine copies its open shards' parts itself, and a shard whose engine is gone is backfilled once another took it over and closed it\n",
				id, ownership(m, l, defaultSkew), m.Owner)
		case m.Backlog:
			fmt.Fprintf(c.stdout, "%s: not backfilled: released with records past its sealed watermark, which the next open seals; backfill it after\n", id)
		default:
			todo = append(todo, id)
			short[id] = missingCopies(c.store, m.Parts)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	dir, err := os.MkdirTemp("", "l0ctl-backfill-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	specs := make([]replica.Spec, len(c.store.replicas))
	for i, r := range c.store.replicas {
		// Failure domains only weigh in the engine's durability gauges, which
		// a backfill does not read.
		specs[i] = replica.Spec{Name: r.Name, Domain: r.Name, Bucket: r.Bucket}
	}
	// BackfillOnOpen: the takeover queues the copies, which BackfillIdle then
	// waits for, rather than warn that no upload will make them.
	e, err := engine.Open(c.ctx, engine.Options{
		Dir: dir, Replicas: specs, Authority: c.store.Authority().Name, Instance: f.instance, BackfillOnOpen: true,
		Logger: slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return fmt.Errorf("open an engine for the backfill: %w", err)
	}
	// What was copied is read back from the manifests: a copy that failed (the
	// uploader gives up after its attempts) leaves its part short, and says so
	// nowhere else.
	total := 0
	var errs []error
	for _, id := range todo {
		_, err := e.BackfillIdle(c.ctx, id)
		mc := loadManifest(c.ctx, c.store.Authority().Bucket, id)
		left := short[id]
		if mc.Present() {
			left = missingCopies(c.store, mc.M.Parts)
		}
		total += short[id] - left
		switch {
		case err != nil:
			fmt.Fprintf(c.stdout, "%s: backfill failed, %d copies made, %d missing: %v\n", id, short[id]-left, left, err)
			errs = append(errs, err)
		case left > 0:
			fmt.Fprintf(c.stdout, "%s: %d copies made, %d still missing (taken by another engine meanwhile, or a copy failed: run again)\n", id, short[id]-left, left)
			c.damaged = true
		default:
			fmt.Fprintf(c.stdout, "%s: made %d part copies\n", id, short[id])
		}
		if c.ctx.Err() != nil {
			break
		}
	}
	if err := e.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close the backfill's engine: %w", err))
	}
	fmt.Fprintf(c.stdout, "backfilled %d part copies of %d shards\n", total, len(todo))
	return errors.Join(errs...)
}

// missingCopies counts the copies the parts lack on the replicas given.
func missingCopies(s *store, parts []manifest.Part) int {
	n := 0
	for _, p := range parts {
		for _, name := range s.Names() {
			if !slices.Contains(p.Replicas, name) {
				n++
			}
		}
	}
	return n
}
