package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
)

// mixedRun is what one phase of the mixed scenario measured.
type mixedRun struct {
	appendLat []time.Duration
	timerLate []time.Duration // how late the generator's timers woke
	schedP99  []float64       // ms; empty with too few waits
	readBytes int64
	lags      []time.Duration
	elapsed   time.Duration
	// user and sys are the process's CPU time in user space and in the kernel
	// while the appends ran: the kernel's share is its file systems' and block
	// layer's work for every write, create, rename and fsync.
	user, sys time.Duration
	cpuOK     bool
}

// mixedScenario runs 8 shards at a steady append rate, in rounds, two ways: alone
// (no seals, no readers), and mixed — a reader tailing every shard through parts
// and WAL, seals every 1 MiB onto a local replica, each part copied to the remote —
// in an order rotated each round, and reports what the mixed work costs the
// appends, per round, beside what the readers and uploads did.
func mixedScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	duration := cfg.mixedFor
	rounds := cfg.longRounds
	prog := newProgress("mixed", 2*rounds)
	runs, err := runRounds(ctx, rounds, 2, prog, func(r, i int) (mixedRun, error) {
		return runMixed(ctx, filepath.Join(root, fmt.Sprintf("mixed-r%d-c%d", r, i)), g, duration, i == 1)
	})
	prog.done()
	if err != nil {
		return err
	}
	alone, mixed := runs[0], runs[1]
	q := func(runs []mixedRun, p float64) []float64 {
		lats := make([][]time.Duration, len(runs))
		for i, m := range runs {
			lats[i] = m.appendLat
		}
		return roundQuantiles(lats, p)
	}
	p50, p99 := pairRatios(q(mixed, .5), q(alone, .5)), pairRatios(q(mixed, .99), q(alone, .99))
	late := func(runs []mixedRun) spread {
		lates := make([][]time.Duration, len(runs))
		for i, m := range runs {
			lates[i] = m.timerLate
		}
		return presentSpread(roundQuantiles(lates, .99))
	}
	sched := func(runs []mixedRun) spread {
		var vs []float64
		for _, m := range runs {
			vs = append(vs, m.schedP99...)
		}
		return presentSpread(vs)
	}
	reads := spreadOf(each(mixed, func(m mixedRun) float64 { return mbps(m.readBytes, m.elapsed) }))
	cores := func(runs []mixedRun, f func(mixedRun) time.Duration) spread {
		return knownSpread(each(runs, func(m mixedRun) float64 {
			if !m.cpuOK {
				return -1
			}
			return ratio(f(m).Seconds(), m.elapsed.Seconds())
		}))
	}
	user := func(m mixedRun) time.Duration { return m.user }
	sys := func(m mixedRun) time.Duration { return m.sys }
	var lags []time.Duration
	for _, m := range mixed {
		lags = append(lags, m.lags...)
	}
	lag := summarizeLatencies(lags)
	targets := []target{bounded("append p99 mixed over alone", 1.5, p99.PerRound, "too few appends per run for a p99")}
	title(out, "mixed", "8 shards at 8 MB/s in all, open loop, %s a run: appends alone, then with a tailing reader per shard, seals every 1 MiB and copies to a %s replica · %d rounds, order rotated · median (min-max)",
		duration, g.kind, rounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tmixed\talone\tmixed / alone\t")
	fmt.Fprintf(tw, "append p50 ms\t%s\t%s\t%s\t\n", presentSpread(q(mixed, .5)), presentSpread(q(alone, .5)), p50)
	fmt.Fprintf(tw, "append p99 ms\t%s\t%s\t%s\t\n", presentSpread(q(mixed, .99)), presentSpread(q(alone, .99)), p99)
	fmt.Fprintf(tw, "generator timer late p99 ms\t%s\t%s\t-\t\n", late(mixed), late(alone))
	fmt.Fprintf(tw, "goroutine wait for a core p99 ms (runtime, whole run)\t%s\t%s\t-\t\n", sched(mixed), sched(alone))
	fmt.Fprintf(tw, "cores busy in user space (process)\t%s\t%s\t-\t\n", cores(mixed, user), cores(alone, user))
	fmt.Fprintf(tw, "cores busy in the kernel (process: writes, creates, renames, fsyncs)\t%s\t%s\t-\t\n", cores(mixed, sys), cores(alone, sys))
	fmt.Fprintf(tw, "tail read MB/s\t%s\t-\t-\t\n", reads)
	fmt.Fprintf(tw, "part committed → on every replica, ms (%d parts, pooled): p50 / p99 / max\t%s / %s / %s\t-\t-\t\n", lag.Samples, cell(lag.P50Ms), cell(lag.P99Ms), num(lag.MaxMs))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "mixed",
		Params:   map[string]any{"shards": 8, "rate_mb_per_s": 8, "seconds": duration.Seconds(), "rounds": rounds, "seal_bytes": 1 << 20, "substrate": g.kind},
		Figures: map[string]any{"append_p50_ms": presentSpread(q(mixed, .5)), "append_p99_ms": presentSpread(q(mixed, .99)),
			"timer_late_p99_ms": late(mixed), "sched_latency_p99_ms": sched(mixed),
			"cores_busy_user": cores(mixed, user), "cores_busy_kernel": cores(mixed, sys),
			"tail_read_mb_per_s": reads, "part_committed_to_on_every_replica": lag},
		Baselines: map[string]map[string]spread{"appends_alone": {"append_p50_ms": presentSpread(q(alone, .5)), "append_p99_ms": presentSpread(q(alone, .99)),
			"timer_late_p99_ms": late(alone), "sched_latency_p99_ms": sched(alone),
			"cores_busy_user": cores(alone, user), "cores_busy_kernel": cores(alone, sys)}},
		Ratios:  map[string]paired{"append_p50_mixed_vs_alone": p50, "append_p99_mixed_vs_alone": p99},
		Targets: targets,
	})
}

// runMixed runs one phase: the appends offered open-loop by the latency
// scenario's generator, after a settling second, and, when mixed, a reader tailing
// each shard while seals and copies run.
func runMixed(ctx context.Context, dir string, g *remote, duration time.Duration, mixed bool) (mixedRun, error) {
	defer removeAndSync(dir)
	local, err := localBucket(filepath.Join(dir, "local"))
	if err != nil {
		return mixedRun{}, err
	}
	defer local.Close()
	remoteBucket, err := g.newBucket(ctx)
	if err != nil {
		return mixedRun{}, err
	}
	defer g.discard(ctx, remoteBucket)
	var run mixedRun
	var mu sync.Mutex
	opts := engine.Options{Durability: durability,
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
	const shards, rateMBps = 8, 8.0
	p := appendParams{appenders: 16, recordSize: recordSize, batch: 16}
	handles, err := openEach(ctx, e, "mixed", shards)
	if err != nil {
		return mixedRun{}, err
	}
	recs := events(p.batch, p.recordSize, 6)
	p = p.sized(recs)
	s := &sink{append: appendTo(ctx, handles, func(int) [][]byte { return recs })}
	var (
		wg       sync.WaitGroup
		readErr  atomic.Pointer[error]
		read     atomic.Int64
		stopRead = make(chan struct{})
	)
	if mixed {
		for _, sh := range handles {
			wg.Go(func() {
				var next uint64
				for {
					for rec, err := range sh.Read(ctx, next) {
						if err != nil {
							readErr.Store(&err)
							return
						}
						read.Add(int64(len(rec.Value)))
						next = rec.Offset + 1
					}
					select {
					case <-stopRead:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			})
		}
	}
	start := time.Now()
	user0, sys0, ok0 := cpuSplit()
	lv, err := runOpen(ctx, s, p, rateMBps, time.Second, duration)
	user1, sys1, ok1 := cpuSplit()
	close(stopRead)
	wg.Wait()
	run.elapsed = time.Since(start) // what the readers read in, not the uploads' drain
	run.user, run.sys, run.cpuOK = user1-user0, sys1-sys0, ok0 && ok1
	if err != nil {
		return mixedRun{}, err
	}
	if errp := readErr.Load(); errp != nil {
		return mixedRun{}, *errp
	}
	run.appendLat, run.timerLate = lv.lat, lv.late
	if lv.schedP99OK {
		run.schedP99 = []float64{ms(lv.schedP99)}
	}
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		return mixedRun{}, err
	}
	run.readBytes = read.Load()
	// A copy that ended after the flush may still be reporting its lag.
	mu.Lock()
	defer mu.Unlock()
	out := run
	out.lags = slices.Clone(run.lags)
	return out, nil
}
