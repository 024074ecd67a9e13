package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// followScenario measures how soon a following read sees a record: one appender
// in a closed loop appends one 1 KiB record at a time, and a reader follows the
// shard (shard.Follow). For each record: its append's ack (call to return) and
// its sighting (call to the follower yielding it), p50 and p99, in Local mode on
// a local directory and in Remote mode on the remote emulator. The target, in
// Local mode: a sighting's p50 at most 1.2x the ack's p50 plus 1 ms.
func followScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	modes := []engine.Durability{engine.Local, engine.Remote}
	prog := newProgress("follow", len(modes)*cfg.longRounds)
	rounds, err := runRounds(ctx, cfg.longRounds, len(modes), prog, func(r, i int) (followRun, error) {
		return followRound(ctx, cfg, filepath.Join(root, fmt.Sprintf("follow-%d-%d", r, i)), g, modes[i])
	})
	prog.done()
	if err != nil {
		return err
	}
	title(out, "follow", "a follower of one shard, one appender in a closed loop, 1 KiB records · %d rounds, order rotated · median (min-max)", cfg.longRounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "mode\tack p50 ms\tseen p50 ms\tack p99 ms\tseen p99 ms\tseen p50 over 1.2x ack p50 + 1 ms\t")
	figures := map[string]spread{}
	ratios := map[string]paired{}
	var targets []target
	for i, mode := range modes {
		var ack, seen [][]time.Duration
		for _, run := range rounds[i] {
			ack, seen = append(ack, run.ack), append(seen, run.seen)
		}
		ackP50, seenP50 := roundQuantiles(ack, 0.5), roundQuantiles(seen, 0.5)
		ackP99, seenP99 := roundQuantiles(ack, 0.99), roundQuantiles(seen, 0.99)
		vs := pairRatios(seenP50, each(ackP50, func(v float64) float64 {
			if v == 0 {
				return 0
			}
			return 1.2*v + 1
		}))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", mode, presentSpread(ackP50), presentSpread(seenP50), presentSpread(ackP99), presentSpread(seenP99), vs)
		name := mode.String()
		figures["seen_p50_ms_"+name], figures["seen_p99_ms_"+name] = presentSpread(seenP50), presentSpread(seenP99)
		figures["ack_p50_ms_"+name], figures["ack_p99_ms_"+name] = presentSpread(ackP50), presentSpread(ackP99)
		ratios["seen_p50_vs_1.2_ack_p50_plus_1ms_"+name] = vs
		if mode == engine.Local {
			targets = append(targets, bounded("Local: a follower's sighting p50 over 1.2x the ack p50 + 1 ms", 1, vs.PerRound, "too few samples"))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "follow",
		Params:   map[string]any{"record_bytes": 1024, "rounds": cfg.longRounds, "window_s": cfg.latencyWindow.Seconds(), "remote": g.kind},
		Figures:  figures,
		Ratios:   ratios,
		Targets:  targets,
	})
}

// followRun is one round in one mode: each record's ack and sighting latency.
type followRun struct{ ack, seen []time.Duration }

func followRound(ctx context.Context, cfg config, dir string, g *remote, mode engine.Durability) (followRun, error) {
	defer os.RemoveAll(dir)
	var bucket *substrate.Bucket
	var err error
	if mode == engine.Local {
		bucket, err = localBucket(filepath.Join(dir, "bucket"))
	} else {
		bucket, err = g.newBucket(ctx)
	}
	if err != nil {
		return followRun{}, err
	}
	defer g.discard(ctx, bucket)
	e, err := engine.Open(ctx, engine.Options{Durability: mode, Dir: filepath.Join(dir, "engine"), Bucket: bucket, Registerer: engineRegisterer("follow")})
	if err != nil {
		return followRun{}, err
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "followed")
	if err != nil {
		return followRun{}, err
	}
	// Each record carries its number; started[n] is when its append began.
	const most = 1 << 20
	started := make([]atomic.Int64, most)
	seen := make([]time.Duration, 0, 1<<16)
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	followed := make(chan error, 1)
	go func() {
		var err error
		for rec, rerr := range sh.Read(fctx, 0, shard.Follow()) {
			if rerr != nil {
				err = rerr
				break
			}
			at := time.Now()
			n := binary.BigEndian.Uint64(rec.Value)
			seen = append(seen, at.Sub(time.Unix(0, started[n].Load())))
		}
		followed <- err
	}()
	settle, win := time.Second, cfg.latencyWindow
	if cfg.quick {
		settle = 200 * time.Millisecond
	}
	var run followRun
	rec := make([]byte, 1024)
	begin := time.Now()
	n := 0
	for ; n < most && time.Since(begin) < settle+win; n++ {
		binary.BigEndian.PutUint64(rec, uint64(n))
		t0 := time.Now()
		started[n].Store(t0.UnixNano())
		if _, err := sh.Append(ctx, rec); err != nil {
			return followRun{}, err
		}
		if t0.Sub(begin) >= settle {
			run.ack = append(run.ack, time.Since(t0))
		}
	}
	time.Sleep(100 * time.Millisecond) // the last sightings
	stop()
	if err := <-followed; err != nil && !errors.Is(err, context.Canceled) {
		return followRun{}, fmt.Errorf("follow: the follower: %w", err)
	}
	if len(seen) != n {
		return followRun{}, fmt.Errorf("follow: the follower saw %d of the %d records", len(seen), n)
	}
	run.seen = seen[n-len(run.ack):] // less the settling records
	return run, nil
}

// failoverScenario measures a failover: two members of a fleet serve 8 shards;
// one of the shards' member is cut off from the store (every call of its client
// fails from then on, as for a machine killed: it renews nothing and acknowledges
// nothing more), and the other, trying an append to that shard every 10 ms once
// it has it open, times the cut until its first append is acknowledged. Its bound
// is the lease (Duration plus the skew margin), which a failover cannot beat:
// after that the leader plans without the dead member, and the new assignee opens
// f, reading the tail. Target: at most 10 s in every round at the defaults.
func failoverScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	var defaults engine.Options
	defaults.EnsureDefaults()
	bound := defaults.Lease.Duration + defaults.Lease.SkewMargin
	prog := newProgress("failover", cfg.longRounds)
	rounds, err := runRounds(ctx, cfg.longRounds, 1, prog, func(r, _ int) (time.Duration, error) {
		return failoverRound(ctx, g, filepath.Join(root, fmt.Sprintf("failover-%d", r)))
	})
	prog.done()
	if err != nil {
		return err
	}
	var secs []float64
	for _, rs := range rounds[0] {
		secs = append(secs, rs.Seconds())
	}
	title(out, "failover", "two members, 8 shards, one cut off from the store · lease %s, skew margin %s, renewed every %s · %d rounds", defaults.Lease.Duration, defaults.Lease.SkewMargin, defaults.RenewEvery, cfg.longRounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tl0\tbound\tratio\t")
	fmt.Fprintf(tw, "cut → first append acknowledged by the new owner, s\t%s (max %s)\t%s\t%s\t\n", spreadOf(secs), num(slices.Max(secs)), num(bound.Seconds()),
		pairRatios(secs, slices.Repeat([]float64{bound.Seconds()}, len(secs))))
	if err := tw.Flush(); err != nil {
		return err
	}
	// Cost of the lease: one conditional write per renewal per engine.
	perMonth := (30 * 24 * time.Hour).Seconds() / defaults.RenewEvery.Seconds()
	fmt.Fprintf(out, "an idle engine's renewals: %.2g writes a month, %.2f USD at 0.005 USD per 1,000 class A operations (GCS, S3 list price)  \n", perMonth, perMonth*0.005/1000)
	targets := []target{atMost("failover seconds, worst round", 10, secs...)}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario:  "failover",
		Params:    map[string]any{"lease_s": defaults.Lease.Duration.Seconds(), "skew_s": defaults.Lease.SkewMargin.Seconds(), "renew_s": defaults.RenewEvery.Seconds(), "rounds": cfg.longRounds, "remote": g.kind},
		Figures:   map[string]spread{"failover_s": spreadOf(secs)},
		Baselines: map[string]map[string]spread{"lease_plus_skew": {"s": spreadOf(slices.Repeat([]float64{bound.Seconds()}, len(secs)))}},
		Targets:   targets,
	})
}

// errCutOff is what a cut-off member's every call to the store returns.
var errCutOff = errors.New("l0bench: cut off")

func failoverRound(ctx context.Context, g *remote, root string) (time.Duration, error) {
	shards := make([]fleet.Shard, 8)
	for i := range shards {
		shards[i] = fleet.Shard{ID: fmt.Sprintf("f%d", i)}
	}
	w, err := newFleetWorld(ctx, g, root, shards)
	if err != nil {
		return 0, err
	}
	defer w.close()
	var ms []*fleetMachine
	for range 2 {
		mc, err := w.join(ctx, 0)
		if err != nil {
			return 0, err
		}
		ms = append(ms, mc)
	}
	if err := w.settled(ctx, time.Minute, func() bool { return len(ms[0].m.Owned()) > 0 && len(ms[1].m.Owned()) > 0 }); err != nil {
		return 0, err
	}
	victim, survivor := ms[0], ms[1]
	id := victim.m.Owned()[0]
	cut := time.Now()
	victim.fd.SetRules(fault.Rule{Err: errCutOff})
	defer victim.fd.SetRules() // back, so that it can leave at the round's end
	rec := []byte("after the failover")
	for {
		if time.Since(cut) > 2*time.Minute {
			return 0, fmt.Errorf("failover: %s not served by the survivor within 2 minutes", id)
		}
		if sh, ok := survivor.m.Shard(id); ok {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := sh.Append(actx, rec)
			cancel()
			if err == nil {
				return time.Since(cut), nil
			}
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return 0, err
		}
	}
}
