package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/replica"
)

// idleRenewEvery is the engine's default lease renewal interval, which the idle
// scenario runs with.
var idleRenewEvery = func() time.Duration {
	var o engine.Options
	o.EnsureDefaults()
	return o.RenewEvery
}()

// idleFigures are what the idle scenario measures.
type idleFigures struct {
	// SetupRequests reached the object store while the shards were opened,
	// appended to and sealed; IdleRequests in the idle window after.
	SetupRequests requestCounts `json:"setup_requests"`
	IdleRequests  requestCounts `json:"idle_requests"`
	IdleSeconds   float64       `json:"idle_seconds"`
	// RequestsPerMinute and ConditionalWritesPerMinute are of the idle window.
	RequestsPerMinute          float64 `json:"requests_per_minute"`
	ConditionalWritesPerMinute float64 `json:"conditional_writes_per_minute"`
	// ConditionalWritesPerRenewal is the whole engine's conditional writes per
	// renewal interval of the idle window.
	ConditionalWritesPerRenewal float64 `json:"conditional_writes_per_renewal_interval"`
	// OtherRequests are the idle window's requests that were not conditional
	// writes: none should be.
	OtherRequests int64 `json:"other_requests"`
	// RSSBytes and GoHeapInuseBytes are of the whole process at the end of the
	// idle window, with no forced GC.
	RSSBytes         int64  `json:"rss_bytes"`
	GoHeapInuseBytes uint64 `json:"go_heap_inuse_bytes"`
}

// idleScenario opens -idle-shards shards on the remote (-remote), through a proxy
// that counts the HTTP requests reaching the object store, and gives every shard a
// sealed part; then it leaves the engine idle for -idle-for and counts the requests
// of that window. An idle engine should do nothing but renew leases, with one
// conditional write per engine per renewal interval. It also reports the process's
// RSS and Go heap at the end of the window, as an idle engine holding that many
// shards keeps them.
func idleScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	f, err := measureIdle(ctx, cfg, filepath.Join(root, "idle"), g)
	if err != nil {
		return err
	}
	renewals := atMost("object-store requests of an idle engine: one conditional write per engine per renewal interval",
		1, f.ConditionalWritesPerRenewal)
	others := atMost("object-store requests of an idle engine: nothing but lease renewals (requests other than conditional writes)",
		0, float64(f.OtherRequests))
	targets := []target{renewals, others}
	rssMiB := float64(f.RSSBytes) / (1 << 20)
	// The bound is for 1,000 shards; more are only reported.
	rssTarget := "judged for ≤ 1,000 shards only"
	if cfg.idleShards <= 1000 {
		t := atMost("process RSS of an idle engine with 1,000 shards, MiB", 256, rssMiB)
		targets, rssTarget = append(targets, t), verdict(t)
	}

	title(out, "idle", "%d shards, each holding a sealed part, idle for %.1fs on %s (%s) · requests counted at a proxy in front of the server · leases renewed every %s",
		cfg.idleShards, f.IdleSeconds, g.kind, g.endpoint, idleRenewEvery)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tvalue\ttarget\t")
	fmt.Fprintf(tw, "requests during setup: open, append, seal every shard\t%d\t-\t\n", f.SetupRequests.Total)
	fmt.Fprintf(tw, "requests per minute, idle\t%s\t-\t\n", num(f.RequestsPerMinute))
	fmt.Fprintf(tw, "conditional writes per minute, idle\t%s\t-\t\n", num(f.ConditionalWritesPerMinute))
	fmt.Fprintf(tw, "conditional writes per renewal interval, whole engine\t%s\t%s\t\n", num(f.ConditionalWritesPerRenewal), verdict(renewals))
	fmt.Fprintf(tw, "other requests in the idle window\t%d\t%s\t\n", f.OtherRequests, verdict(others))
	fmt.Fprintf(tw, "process RSS at the end of the window (proxy, in-process emulator included)\t%.1f MiB\t%s\t\n", rssMiB, rssTarget)
	fmt.Fprintf(tw, "Go heap in use at the end of the window\t%.1f MiB\t-\t\n", float64(f.GoHeapInuseBytes)/(1<<20))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "requests by kind, setup: %s; idle window: %s\n\n", countsString(f.SetupRequests.ByKind), countsString(f.IdleRequests.ByKind))
	return emit(results, resultLine{
		Scenario: "idle",
		Params: map[string]any{"shards": cfg.idleShards, "idle_seconds": cfg.idleFor.Seconds(), "renew_seconds": idleRenewEvery.Seconds(),
			"substrate": g.kind, "counted_at": "http proxy"},
		Figures: f,
		Targets: targets,
	})
}

// measureIdle opens an engine in dir on a new bucket of g, reached through a
// counting proxy, fills -idle-shards shards, waits for their seals and copies to
// settle, and then counts the requests of the -idle-for window and takes the
// memory at its end.
func measureIdle(ctx context.Context, cfg config, dir string, g *remote) (idleFigures, error) {
	p, err := startProxy(g)
	if err != nil {
		return idleFigures{}, err
	}
	defer p.stop()
	bucket, err := newBucketThrough(ctx, g, p)
	if err != nil {
		return idleFigures{}, err
	}
	defer bucket.Close()
	e, err := engine.Open(ctx, engine.Options{Durability: durability,
		Dir: dir, Replicas: []replica.Spec{{Name: g.kind, Domain: "cloud", Bucket: bucket}},
		Seal: quietSeal(), RenewEvery: idleRenewEvery, Registerer: engineRegisterer("idle"),
	})
	if err != nil {
		return idleFigures{}, err
	}
	defer e.Close()
	prog := newProgress("idle", cfg.idleShards+int(cfg.idleFor/time.Second))
	defer prog.done()
	if err := fillShards(ctx, e, cfg.idleShards, prog); err != nil {
		return idleFigures{}, err
	}
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		return idleFigures{}, err
	}
	f := idleFigures{SetupRequests: p.snapshot()}
	start := time.Now()
	for time.Since(start) < cfg.idleFor {
		if err := sleep(ctx, min(time.Second, cfg.idleFor-time.Since(start))); err != nil {
			return idleFigures{}, err
		}
		prog.step()
	}
	elapsed := time.Since(start)
	f.IdleRequests = p.snapshot().minus(f.SetupRequests)
	// The whole process: an upper bound on the engine's share, since it includes
	// the proxy, an in-process emulator (with every part it stores) and what
	// earlier scenarios left to the Go runtime.
	f.RSSBytes = currentRSS()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	f.GoHeapInuseBytes = mem.HeapInuse

	cond := f.IdleRequests.ByKind[kindConditional]
	f.IdleSeconds = elapsed.Seconds()
	f.RequestsPerMinute = float64(f.IdleRequests.Total) / elapsed.Minutes()
	f.ConditionalWritesPerMinute = float64(cond) / elapsed.Minutes()
	f.ConditionalWritesPerRenewal = float64(cond) / (elapsed.Seconds() / idleRenewEvery.Seconds())
	f.OtherRequests = f.IdleRequests.Total - cond
	return f, nil
}

// fillShards opens n shards on e, 16 at a time, and appends a few records to each
// and seals them, so that every shard the idle engine holds has a part and a
// manifest that names it, as a shard of a running system does.
func fillShards(ctx context.Context, e *engine.Engine, n int, prog *progress) error {
	recs := events(4, recordSize, 9)
	ids := make(chan int, n)
	for i := range n {
		ids <- i
	}
	close(ids)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range ids {
				err := fillShard(ctx, e, fmt.Sprintf("idle-%04d", i), recs)
				mu.Lock()
				first = cmp.Or(first, err)
				prog.step()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// fillShard opens shard id, appends recs and seals them into a part.
func fillShard(ctx context.Context, e *engine.Engine, id string, recs [][]byte) error {
	sh, err := e.OpenShard(ctx, id)
	if err != nil {
		return err
	}
	if err := appendAll(ctx, sh, recs); err != nil {
		return err
	}
	_, err = sh.Seal(ctx, 1<<40)
	return err
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// verdict is a target for a table cell: "≤ 1: NOT met".
func verdict(t target) string {
	if t.Met {
		return t.Bound + ": met"
	}
	return t.Bound + ": NOT met"
}

// countsString is "a 3, b 1", by key, or "none".
func countsString[K ~string](counts map[K]int64) string {
	if len(counts) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
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
