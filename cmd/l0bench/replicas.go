package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// runBackfill seals parts parts of recs each on a local replica, attaches a fresh
// GCS emulator bucket, and times BackfillUnderReplicated + FlushAndWaitUploads; and,
// as the baseline, puts the same objects to another fresh bucket through the same
// client with as many writers as the uploader has workers: first, with rawFirst.
func runBackfill(ctx context.Context, dir string, g *remote, parts int, recs [][]byte, rawFirst bool) (backfill, raw time.Duration, bytes int64, err error) {
	local, err := localBucket(filepath.Join(dir, "local"))
	if err != nil {
		return 0, 0, 0, err
	}
	defer local.Close()
	e, sh, err := backlog(ctx, filepath.Join(dir, "engine"), local, "history", nil)
	if err != nil {
		return 0, 0, 0, err
	}
	for range parts {
		if err := appendAll(ctx, sh, recs); err != nil {
			e.Close()
			return 0, 0, 0, err
		}
		if _, err := sh.Seal(ctx, 1<<40); err != nil {
			e.Close()
			return 0, 0, 0, err
		}
	}
	keys := []string{}
	for _, p := range sh.Manifest().Parts {
		keys = append(keys, p.Key)
		bytes += p.Size
	}
	sh.Close(ctx)
	e.Close()
	objects := make([][]byte, len(keys))
	for i, k := range keys {
		if objects[i], _, err = local.Get(ctx, k); err != nil {
			return 0, 0, 0, err
		}
	}
	putRaw := func() error {
		rawBucket, err := g.newBucket(ctx)
		if err != nil {
			return err
		}
		defer rawBucket.Close()
		raw, err = parallelPuts(ctx, rawBucket, keys, objects, 4)
		return err
	}
	if rawFirst {
		if err := putRaw(); err != nil {
			return 0, 0, 0, err
		}
	}

	remote, err := g.newBucket(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer remote.Close()
	e, err = engine.Open(ctx, engine.Options{Dir: filepath.Join(dir, "engine"), Seal: quietSeal(), Authority: "local", Registerer: engineRegisterer("backfill"),
		Replicas: []replica.Spec{{Name: "local", Domain: "node", Bucket: local}, {Name: g.kind, Domain: "cloud", Bucket: remote}}})
	if err != nil {
		return 0, 0, 0, err
	}
	defer e.Close()
	if _, err := e.OpenShard(ctx, "history"); err != nil {
		return 0, 0, 0, err
	}
	start := time.Now()
	n, err := e.BackfillUnderReplicated(ctx)
	if err == nil {
		err = e.FlushAndWaitUploads(ctx)
	}
	backfill = time.Since(start)
	if err != nil {
		return 0, 0, 0, err
	}
	if m := e.Metrics(); n != parts || m.BackfillUploads != uint64(parts) || m.Data.UnderReplicated != 0 {
		return 0, 0, 0, fmt.Errorf("backfill queued %d, copied %d of %d parts", n, m.BackfillUploads, parts)
	}
	if !rawFirst {
		if err := putRaw(); err != nil {
			return 0, 0, 0, err
		}
	}
	return backfill, raw, bytes, nil
}

// parallelPuts puts objects under keys from writers goroutines.
func parallelPuts(ctx context.Context, b *substrate.Bucket, keys []string, objects [][]byte, writers int) (time.Duration, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(keys))
	next := make(chan int, len(keys))
	for i := range keys {
		next <- i
	}
	close(next)
	for range writers {
		wg.Go(func() {
			for i := range next {
				_, _, errs[i] = b.PutIfAbsentBytes(ctx, keys[i], objects[i])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func backfillScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	parts := cfg.backfillParts
	recs := events(recordsFor(cfg.backfillMB), recordSize, 3)
	prog := newProgress("backfill", cfg.rounds)
	var fills, raws []time.Duration
	var size int64
	for r := range cfg.rounds {
		f, w, n, err := runBackfill(ctx, filepath.Join(root, fmt.Sprintf("backfill-%d", r)), g, parts, recs, r%2 == 1)
		if err != nil {
			return fmt.Errorf("backfill, round %d: %w", r, err)
		}
		fills, raws, size = append(fills, f), append(raws, w), n
		prog.step()
	}
	prog.done()
	mbps := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	fm, rm := middle(slices.Clone(fills)), middle(slices.Clone(raws))
	vs := pairRatios(seconds(raws), seconds(fills))
	fmt.Fprintf(out, "backfill · %d parts, %.1f MB of part objects, from a local replica to an attached remote replica (%s %s) · %s\n",
		parts, float64(size)/1e6, g.kind, g.endpoint, "paired")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tMB/s\tms\tvs raw\t")
	fmt.Fprintf(tw, "BackfillUnderReplicated + FlushAndWaitUploads\t%.1f\t%.1f\t%.2fx\t\n", mbps(fm), ms(fm), vs)
	fmt.Fprintf(tw, "raw put of the same objects, same client, 4 writers\t%.1f\t%.1f\t1.00x\t\n", mbps(rm), ms(rm))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario:  "backfill",
		Params:    map[string]any{"parts": parts, "object_bytes": size, "rounds": cfg.rounds, "substrate": g.kind, "workers": 4},
		Figures:   map[string]float64{"mb_per_s": mbps(fm), "ms": ms(fm)},
		Baselines: map[string]map[string]float64{"raw_put_same_client": {"mb_per_s": mbps(rm), "ms": ms(rm)}},
		Ratios:    map[string]paired{"mb_per_s_vs_raw_put": vs},
	})
}

// lagScenario appends at a steady rate to shards sealing by size onto a local
// replica, copied to a GCS emulator replica, and reports the seal → durable on
// every replica lag; beside it, the latency of a raw put of a part-sized object.
func lagScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	local, err := localBucket(filepath.Join(root, "lag-local"))
	if err != nil {
		return err
	}
	defer local.Close()
	remote, err := g.newBucket(ctx)
	if err != nil {
		return err
	}
	defer remote.Close()
	var mu sync.Mutex
	var lags []time.Duration
	const shards, rateMBps = 4, 4.0
	e, err := engine.Open(ctx, engine.Options{
		Dir: filepath.Join(root, "lag-engine"), Authority: "local", Registerer: engineRegisterer("lag"),
		Replicas: []replica.Spec{{Name: "local", Domain: "node", Bucket: local}, {Name: g.kind, Domain: "cloud", Bucket: remote}},
		Seal:     seal.Options{SizeBytes: 1 << 20, Age: time.Hour, Interval: 50 * time.Millisecond},
		Upload: replica.Options{ObserveLag: func(d time.Duration) {
			mu.Lock()
			lags = append(lags, d)
			mu.Unlock()
		}},
	})
	if err != nil {
		return err
	}
	defer e.Close()
	recs := events(16, recordSize, 4)
	batchBytes := 16 * recordSize
	interval := time.Duration(float64(time.Second) * float64(batchBytes*shards) / (rateMBps * 1e6))
	duration := 6 * time.Second
	prog := newProgress("lag", int(duration/time.Second))
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	var first *shard.Shard
	deadline := time.Now().Add(duration)
	for s := range shards {
		sh, err := e.OpenShard(ctx, fmt.Sprint("lag-", s))
		if err != nil {
			return err
		}
		if first == nil {
			first = sh
		}
		wg.Go(func() {
			for t := time.Now(); t.Before(deadline); t = t.Add(interval) {
				time.Sleep(time.Until(t))
				if _, err := sh.Append(ctx, recs...); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		prog.step()
	}
	wg.Wait()
	prog.done()
	if errp := failed.Load(); errp != nil {
		return *errp
	}
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		return err
	}
	mu.Lock()
	samples := slices.Clone(lags)
	mu.Unlock()
	if len(samples) == 0 {
		return fmt.Errorf("lag: no part became durable")
	}
	// The baseline: raw puts of objects the size of the parts, same client.
	var partSize int64
	if parts := first.Manifest().Parts; len(parts) > 0 {
		partSize = parts[0].Size
	}
	obj := make([]byte, max(partSize, 1))
	var puts []time.Duration
	for i := range 20 {
		start := time.Now()
		if _, _, err := remote.PutIfAbsentBytes(ctx, fmt.Sprint("raw/", i), obj); err != nil {
			return err
		}
		puts = append(puts, time.Since(start))
	}
	pct := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		d, _ := quantile(s, p)
		return d
	}
	fmt.Fprintf(out, "lag · %d shards at %.0f MB/s in all, sealing every 1 MiB onto a local replica, copied to a %s replica (%s) · %s · %d parts\n",
		shards, rateMBps, g.kind, g.endpoint, duration, len(samples))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tp50 ms\tp99 ms\tmax ms\t")
	fmt.Fprintf(tw, "seal → durable on every replica\t%.1f\t%.1f\t%.1f\t\n", ms(pct(samples, .5)), ms(pct(samples, .99)), ms(slices.Max(samples)))
	fmt.Fprintf(tw, "raw put of a %d-byte object, same client\t%.1f\t%.1f\t%.1f\t\n", len(obj), ms(pct(puts, .5)), ms(pct(puts, .99)), ms(slices.Max(puts)))
	if err := tw.Flush(); err != nil {
		return err
	}
	met := "met"
	if pct(samples, .99) > 2*time.Second {
		met = "NOT met"
	}
	fmt.Fprintf(out, "target: p99 within 2 s against the local emulators: %s\n\n", met)
	return emit(results, resultLine{
		Scenario:  "lag",
		Params:    map[string]any{"shards": shards, "rate_mb_per_s": rateMBps, "seal_bytes": 1 << 20, "seconds": duration.Seconds(), "parts": len(samples)},
		Figures:   map[string]float64{"lag_p50_ms": ms(pct(samples, .5)), "lag_p99_ms": ms(pct(samples, .99)), "lag_max_ms": ms(slices.Max(samples))},
		Baselines: map[string]map[string]float64{"raw_put_part_size": {"p50_ms": ms(pct(puts, .5)), "p99_ms": ms(pct(puts, .99))}},
		Ratios:    nil,
	})
}
