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
)

// mixedRun is what one phase of the mixed scenario measured.
type mixedRun struct {
	appendLat []time.Duration
	readBytes int64
	lags      []time.Duration
	elapsed   time.Duration
}

// mixedScenario runs 8 shards at a steady append rate twice: alone (no seals, no
// readers), then mixed — a reader tailing every shard through parts and WAL, seals
// every 1 MiB onto a local replica, each part copied to the remote — and reports
// what the mixed work costs the appends, beside what the readers and uploads did.
func mixedScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	duration := 4 * time.Second
	prog := newProgress("mixed", 2*int(duration/time.Second))
	alone, err := runMixed(ctx, filepath.Join(root, "mixed-alone"), g, duration, false, prog)
	if err != nil {
		return err
	}
	mixed, err := runMixed(ctx, filepath.Join(root, "mixed"), g, duration, true, prog)
	if err != nil {
		return err
	}
	prog.done()
	pct := func(ds []time.Duration, p float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		d, _ := quantile(s, p)
		return ms(d)
	}
	readMBps := float64(mixed.readBytes) / 1e6 / mixed.elapsed.Seconds()
	fmt.Fprintf(out, "mixed · 8 shards at 8 MB/s in all for %s: appends alone, then with a tailing reader per shard, seals every 1 MiB and copies to a %s replica\n",
		duration, g.kind)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tmixed\talone\tmixed / alone\t")
	fmt.Fprintf(tw, "append p50 ms\t%.2f\t%.2f\t%.2fx\t\n", pct(mixed.appendLat, .5), pct(alone.appendLat, .5), ratio(pct(mixed.appendLat, .5), pct(alone.appendLat, .5)))
	fmt.Fprintf(tw, "append p99 ms\t%.2f\t%.2f\t%.2fx\t\n", pct(mixed.appendLat, .99), pct(alone.appendLat, .99), ratio(pct(mixed.appendLat, .99), pct(alone.appendLat, .99)))
	fmt.Fprintf(tw, "tail read MB/s\t%.1f\t-\t-\t\n", readMBps)
	fmt.Fprintf(tw, "seal → durable p99 ms (%d parts)\t%.1f\t-\t-\t\n", len(mixed.lags), pct(mixed.lags, .99))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "mixed",
		Params:   map[string]any{"shards": 8, "rate_mb_per_s": 8, "seconds": duration.Seconds(), "seal_bytes": 1 << 20, "substrate": g.kind},
		Figures: map[string]float64{"append_p50_ms": pct(mixed.appendLat, .5), "append_p99_ms": pct(mixed.appendLat, .99),
			"tail_read_mb_per_s": readMBps, "lag_p99_ms": pct(mixed.lags, .99), "parts": float64(len(mixed.lags))},
		Baselines: map[string]map[string]float64{"appends_alone": {"append_p50_ms": pct(alone.appendLat, .5), "append_p99_ms": pct(alone.appendLat, .99)}},
		Ratios:    nil,
	})
}

func runMixed(ctx context.Context, dir string, g *remote, duration time.Duration, mixed bool, prog *progress) (mixedRun, error) {
	local, err := localBucket(filepath.Join(dir, "local"))
	if err != nil {
		return mixedRun{}, err
	}
	defer local.Close()
	remoteBucket, err := g.newBucket(ctx)
	if err != nil {
		return mixedRun{}, err
	}
	defer remoteBucket.Close()
	var run mixedRun
	var mu sync.Mutex
	opts := engine.Options{
		Dir: filepath.Join(dir, "engine"), Authority: "local", Seal: quietSeal(), Registerer: engineRegisterer("mixed"),
		Replicas: []replica.Spec{{Name: "local", Domain: "node", Bucket: local}, {Name: g.kind, Domain: "cloud", Bucket: remoteBucket}},
		Upload: replica.Options{ObserveLag: func(d time.Duration) {
			mu.Lock()
			run.lags = append(run.lags, d)
			mu.Unlock()
		}},
	}
	if mixed {
		opts.Seal = seal.Options{SizeBytes: 1 << 20, Age: time.Hour, Interval: 50 * time.Millisecond}
	}
	e, err := engine.Open(ctx, opts)
	if err != nil {
		return mixedRun{}, err
	}
	defer e.Close()
	const shards, appenders, rateMBps = 8, 16, 8.0
	handles := make([]*shard.Shard, shards)
	for i := range handles {
		if handles[i], err = e.OpenShard(ctx, fmt.Sprint("mixed-", i)); err != nil {
			return mixedRun{}, err
		}
	}
	recs := events(16, recordSize, 6)
	interval := time.Duration(float64(time.Second) * float64(16*recordSize*appenders) / (rateMBps * 1e6))
	start := time.Now()
	deadline := start.Add(duration)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	lats := make([][]time.Duration, appenders)
	for w := range appenders {
		wg.Go(func() {
			due := start.Add(interval * time.Duration(w) / appenders)
			for ; due.Before(deadline); due = due.Add(interval) {
				time.Sleep(time.Until(due))
				if _, err := handles[w%shards].Append(ctx, recs...); err != nil {
					failed.Store(&err)
					return
				}
				lats[w] = append(lats[w], time.Since(due))
			}
		})
	}
	var read atomic.Int64
	if mixed {
		for _, sh := range handles {
			wg.Go(func() {
				var next uint64
				for time.Now().Before(deadline) {
					for rec, err := range sh.Read(ctx, next) {
						if err != nil {
							failed.Store(&err)
							return
						}
						read.Add(int64(len(rec.Value)))
						next = rec.Offset + 1
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		prog.step()
	}
	wg.Wait()
	run.elapsed = time.Since(start) // what the readers read in, not the uploads' drain
	if errp := failed.Load(); errp != nil {
		return mixedRun{}, *errp
	}
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		return mixedRun{}, err
	}
	run.readBytes = read.Load()
	for _, l := range lats {
		run.appendLat = append(run.appendLat, l...)
	}
	return run, nil
}
