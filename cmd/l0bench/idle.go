package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
)

// idleScenario opens -idle-shards shards on the remote (-remote), with nothing unsealed,
// then leaves the engine idle and counts its object-store operations: an idle engine
// should do nothing but renew leases, at most one conditional write per owned shard
// per renewal interval (the default 10 s). It also reports the engine's RSS with
// every shard open.
func idleScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	bucket, err := g.newBucket(ctx)
	if err != nil {
		return err
	}
	defer bucket.Close()
	const renew = 10 * time.Second // the default
	e, err := engine.Open(ctx, engine.Options{
		Dir: filepath.Join(root, "idle"), Replicas: []replica.Spec{{Name: g.kind, Domain: "cloud", Bucket: bucket}},
		Seal: quietSeal(), RenewEvery: renew, Registerer: engineRegisterer("idle"),
	})
	if err != nil {
		return err
	}
	defer e.Close()
	prog := newProgress("idle", cfg.idleShards+int(cfg.idleFor/time.Second))
	var mu sync.Mutex
	var setupErr error
	var wg sync.WaitGroup
	ids := make(chan int, cfg.idleShards)
	for i := range cfg.idleShards {
		ids <- i
	}
	close(ids)
	for range 16 {
		wg.Go(func() {
			for i := range ids {
				_, err := e.OpenShard(ctx, fmt.Sprintf("idle-%04d", i))
				mu.Lock()
				setupErr = cmp.Or(setupErr, err)
				prog.step()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if setupErr != nil {
		return setupErr
	}
	runtime.GC()
	// The whole process: an upper bound on the engine's share, since it includes
	// the in-process emulator and what earlier scenarios left to the Go runtime.
	rss := currentRSS()
	before := bucket.Stats()
	start := time.Now()
	for time.Since(start) < cfg.idleFor {
		time.Sleep(time.Second)
		prog.step()
	}
	elapsed := time.Since(start)
	after := bucket.Stats()
	prog.done()
	ops, cond := diffOps(before, after)
	perMin := float64(ops) / elapsed.Minutes()
	perShardPerRenewal := float64(cond) / float64(cfg.idleShards) / (elapsed.Seconds() / renew.Seconds())
	met := "met"
	if perShardPerRenewal > 1.05 || ops > cond {
		met = "NOT met"
	}
	memMet := "met"
	if rss > 256<<20 {
		memMet = "NOT met"
	}
	fmt.Fprintf(out, "idle · %d shards open, nothing unsealed, idle for %s on %s (%s) · lease renewed every %s\n",
		cfg.idleShards, elapsed.Round(time.Second), g.kind, g.endpoint, renew)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tvalue\ttarget\t")
	fmt.Fprintf(tw, "object-store operations per minute\t%.0f\t-\t\n", perMin)
	fmt.Fprintf(tw, "conditional writes per shard per renewal interval\t%.2f\t≤ 1, and nothing else: %s\t\n", perShardPerRenewal, met)
	fmt.Fprintf(tw, "process RSS with every shard open (emulator included)\t%.1f MiB\t< 256 MiB for 1,000 shards: %s\t\n", float64(rss)/(1<<20), memMet)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "idle",
		Params:   map[string]any{"shards": cfg.idleShards, "seconds": elapsed.Seconds(), "renew_seconds": renew.Seconds(), "substrate": g.kind},
		Figures: map[string]float64{"ops_per_minute": perMin, "conditional_writes_per_shard_per_renewal": perShardPerRenewal,
			"other_ops": float64(ops - cond), "rss_bytes": float64(rss)},
		Baselines: map[string]map[string]float64{"target": {"conditional_writes_per_shard_per_renewal": 1, "rss_bytes_per_1000_shards": 256 << 20}},
		Ratios:    nil,
	})
}

// diffOps returns the operations between two snapshots, and how many of them were
// conditional writes.
func diffOps(before, after substrate.Stats) (ops, conditional uint64) {
	for op := range after.Operations {
		n := after.Total(op) - before.Total(op)
		ops += n
		if op == substrate.OpCompareAndSwap || op == substrate.OpPutIfAbsent {
			conditional += n
		}
	}
	return ops, conditional
}

// currentRSS is the process's resident set size now, from /proc.
// Without /proc it falls back to the peak RSS.
func currentRSS() int64 {
	if n, err := statmRSS(); err == nil {
		return n
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Maxrss * 1024
}
