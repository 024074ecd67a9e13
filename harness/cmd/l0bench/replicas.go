package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate"
)

// uploadWorkers is the uploader's default number of concurrent copies, which the
// raw baselines match.
const uploadWorkers = 4

// history is a shard's sealed history on a local replica, built once and copied
// for every round so that each round backfills the same parts to a fresh remote.
type history struct {
	dir   string // holds engine/ and local/
	parts []manifest.Part
	bytes int64 // of the part objects
}

// buildHistory seals parts parts of recs for shard "history" onto a local replica
// in dir.
func buildHistory(ctx context.Context, dir string, parts int, recs [][]byte) (history, error) {
	local, err := localBucket(filepath.Join(dir, "local"))
	if err != nil {
		return history{}, err
	}
	defer local.Close()
	e, sh, err := backlog(ctx, filepath.Join(dir, "engine"), local, "history", nil)
	if err != nil {
		return history{}, err
	}
	defer e.Close()
	for range parts {
		if err := appendAll(ctx, sh, recs); err != nil {
			return history{}, err
		}
		if _, err := sh.Seal(ctx, 1<<40); err != nil {
			return history{}, err
		}
	}
	h := history{dir: dir, parts: sh.Manifest().Parts}
	for _, p := range h.parts {
		h.bytes += p.Size
	}
	return h, sh.Close(ctx)
}

// copyTree copies the directory tree src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// runBackfill copies the history to dir, opens it with a fresh remote replica
// attached, and times BackfillUnderReplicated + FlushAndWaitUploads: every part read
// from the local replica, checked, put, and recorded in the manifest, whose copy
// reaches the remote too.
func runBackfill(ctx context.Context, dir string, g *remote, h history) (time.Duration, error) {
	if err := copyTree(h.dir, dir); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	local, err := localBucket(filepath.Join(dir, "local"))
	if err != nil {
		return 0, err
	}
	defer local.Close()
	remote, err := g.newBucket(ctx)
	if err != nil {
		return 0, err
	}
	defer g.discard(ctx, remote)
	e, err := engine.Open(ctx, engine.Options{Durability: durability, Dir: filepath.Join(dir, "engine"), Seal: quietSeal(), Authority: "local", Registerer: engineRegisterer("backfill"),
		Replicas: []replica.Spec{{Name: "local", Domain: "node", Bucket: local}, {Name: g.kind, Domain: "cloud", Bucket: remote}}})
	if err != nil {
		return 0, err
	}
	defer e.Close()
	if _, err := e.OpenShard(ctx, "history"); err != nil {
		return 0, err
	}
	start := time.Now()
	n, err := e.BackfillUnderReplicated(ctx)
	if err == nil {
		err = e.FlushAndWaitUploads(ctx)
	}
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if m := e.Metrics(); n != len(h.parts) || m.BackfillUploads != uint64(len(h.parts)) || m.Data.UnderReplicated != 0 {
		return 0, fmt.Errorf("backfill queued %d, copied %d of %d parts", n, m.BackfillUploads, len(h.parts))
	}
	return took, nil
}

// runRawBackfill does the same work by hand, as fast as the client allows: from
// uploadWorkers goroutines, get each part from the local replica, check its size
// and CRC, and put it on a fresh remote bucket if absent; then put the manifest.
func runRawBackfill(ctx context.Context, g *remote, h history) (time.Duration, error) {
	local, err := localBucket(filepath.Join(h.dir, "local"))
	if err != nil {
		return 0, err
	}
	defer local.Close()
	remote, err := g.newBucket(ctx)
	if err != nil {
		return 0, err
	}
	defer g.discard(ctx, remote)
	start := time.Now()
	err = forEach(len(h.parts), uploadWorkers, func(i int) error { return copyPart(ctx, local, remote, h.parts[i]) })
	if err == nil {
		var m []byte
		if m, _, err = local.Get(ctx, manifest.Key("history")); err == nil {
			_, _, err = remote.PutIfAbsentBytes(ctx, manifest.Key("history"), m)
		}
	}
	return time.Since(start), err
}

// copyPart gets p from src, checks it against its manifest entry and puts it on dst.
func copyPart(ctx context.Context, src, dst *substrate.Bucket, p manifest.Part) error {
	data, _, err := src.Get(ctx, p.Key)
	if err != nil {
		return err
	}
	n, crc, err := part.Checksum(bytes.NewReader(data), p.Size)
	if err != nil {
		return err
	}
	if n != p.Size || crc != p.CRC {
		return fmt.Errorf("%s: %d bytes with CRC %08x, want %d with %08x", p.Key, n, crc, p.Size, p.CRC)
	}
	_, _, err = dst.PutIfAbsentBytes(ctx, p.Key, data)
	return err
}

// forEach runs f(0..n-1) from workers goroutines and returns the first error.
func forEach(n, workers int, f func(i int) error) error {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				errs[i] = f(i)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func backfillScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	recs := events(recordsFor(cfg.backfillMB), recordSize, 3)
	h, err := buildHistory(ctx, filepath.Join(root, "backfill-history"), cfg.backfillParts, recs)
	if err != nil {
		return err
	}
	prog := newProgress("backfill", 2*cfg.rounds)
	times, err := runRounds(ctx, cfg.rounds, 2, prog, func(r, i int) (time.Duration, error) {
		if i == 1 {
			return runRawBackfill(ctx, g, h)
		}
		return runBackfill(ctx, filepath.Join(root, fmt.Sprintf("backfill-%d", r)), g, h)
	})
	prog.done()
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	rate := func(ds []time.Duration) []float64 {
		return each(ds, func(d time.Duration) float64 { return mbps(h.bytes, d) })
	}
	fills, raws := rate(times[0]), rate(times[1])
	vs := pairRatios(fills, raws)
	t := atLeast("backfill MB/s over the raw copy's", 0.8, vs.PerRound...)
	title(out, "backfill", "%d parts, %.1f MB of part objects, from a local replica to an attached remote replica (%s %s) · %d rounds, order rotated · median (min-max)",
		len(h.parts), float64(h.bytes)/1e6, g.kind, g.endpoint, cfg.rounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "contender\tMB/s\tms\tvs raw\t")
	fmt.Fprintf(tw, "BackfillUnderReplicated + FlushAndWaitUploads\t%s\t%s\t%s\t\n", spreadOf(fills), num(ms(middle(slices.Clone(times[0])))), vs)
	fmt.Fprintf(tw, "raw copy, %d writers: get, check size and CRC, put if absent; then the manifest\t%s\t%s\t1.00x\t\n", uploadWorkers, spreadOf(raws), num(ms(middle(slices.Clone(times[1])))))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n\n", t)
	return emit(results, resultLine{
		Scenario:  "backfill",
		Params:    map[string]any{"parts": len(h.parts), "object_bytes": h.bytes, "rounds": cfg.rounds, "substrate": g.kind, "workers": uploadWorkers},
		Figures:   map[string]spread{"mb_per_s": spreadOf(fills)},
		Baselines: map[string]map[string]spread{"raw_copy_same_client": {"mb_per_s": spreadOf(raws)}},
		Ratios:    map[string]paired{"mb_per_s_vs_raw_copy": vs},
		Targets:   []target{t},
	})
}

// lagSlice is what one slice of the lag run measured: the parts that reached every
// replica in it and the raw puts made in it.
type lagSlice struct {
	lags, puts []time.Duration
}

// lagScenario appends at a steady rate to shards sealing by size onto a local
// replica, copied to a remote replica, and measures the lag from a part's commit on
// the local replica to its copy on every replica. Beside it, under the same load,
// each part that becomes durable sets off one raw put of the bytes of a real part
// of the same size to the same remote through the same client. The run is cut
// into -rounds slices of time, and each ratio is the median of the slices'.
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
	defer g.discard(ctx, remote)
	rounds := cfg.rounds
	cuts := make([]lagSlice, rounds)
	var mu sync.Mutex
	var begin time.Time
	slice := func() int { return min(rounds-1, int(time.Since(begin)*time.Duration(rounds)/cfg.lagFor)) }
	durable := make(chan struct{}, 1024)
	const shards, rateMBps, partBytes = 8, 8.0, 512 << 10
	e, err := engine.Open(ctx, engine.Options{Durability: durability,
		Dir: filepath.Join(root, "lag-engine"), Authority: "local", Registerer: engineRegisterer("lag"),
		Replicas: []replica.Spec{{Name: "local", Domain: "node", Bucket: local}, {Name: g.kind, Domain: "cloud", Bucket: remote}},
		Seal:     seal.Options{SizeBytes: partBytes, Age: time.Hour, Interval: 50 * time.Millisecond},
		Upload: replica.Options{ObserveLag: func(d time.Duration) {
			mu.Lock()
			if !begin.IsZero() {
				s := slice()
				cuts[s].lags = append(cuts[s].lags, d)
			}
			mu.Unlock()
			select {
			case durable <- struct{}{}:
			default:
			}
		}},
	})
	if err != nil {
		return err
	}
	defer e.Close()
	handles, err := openEach(ctx, e, "lag", shards)
	if err != nil {
		return err
	}
	p := appendParams{appenders: shards, recordSize: recordSize, batch: 16}
	recs := events(p.batch, p.recordSize, 4)
	p = p.sized(recs)
	s := &sink{append: appendTo(ctx, handles, func(int) [][]byte { return recs })}
	prog := newProgress("lag", 1)
	// A settling run until the first part is durable gives the baseline its bytes.
	if _, err := runOpen(ctx, s, p, rateMBps, 0, time.Second); err != nil {
		return err
	}
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		return err
	}
	parts := handles[0].Manifest().Parts
	if len(parts) == 0 {
		return fmt.Errorf("lag: no part sealed while settling")
	}
	obj, _, err := local.Get(ctx, parts[0].Key)
	if err != nil {
		return err
	}
	for len(durable) > 0 {
		<-durable
	}
	mu.Lock()
	begin = time.Now()
	mu.Unlock()
	stopPuts := make(chan struct{})
	var puts sync.WaitGroup
	var putErr error
	puts.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-durable:
			case <-stopPuts:
				return
			}
			start := time.Now()
			if _, _, err := remote.PutIfAbsentBytes(ctx, fmt.Sprint("raw/", i), obj); err != nil {
				putErr = err
				return
			}
			mu.Lock()
			s := slice()
			cuts[s].puts = append(cuts[s].puts, time.Since(start))
			mu.Unlock()
		}
	})
	_, err = runOpen(ctx, s, p, rateMBps, 0, cfg.lagFor)
	if err == nil {
		err = e.FlushAndWaitUploads(ctx)
	}
	close(stopPuts)
	puts.Wait()
	prog.step()
	prog.done()
	if err != nil {
		return err
	}
	if putErr != nil {
		return putErr
	}
	mu.Lock()
	defer mu.Unlock()
	var allLags, allPuts [][]time.Duration
	for _, s := range cuts {
		allLags, allPuts = append(allLags, s.lags), append(allPuts, s.puts)
	}
	pooledLag, pooledPut := summarizeLatencies(slices.Concat(allLags...)), summarizeLatencies(slices.Concat(allPuts...))
	if pooledLag.Samples == 0 {
		return fmt.Errorf("lag: no part became durable")
	}
	vsP50 := pairRatios(roundQuantiles(allLags, 0.5), roundQuantiles(allPuts, 0.5))
	targets := []target{
		atMost("part committed → on every replica, worst ms (bounds the p99)", 2000, pooledLag.MaxMs),
		atMost("worst lag over the worst raw put of a part", 3, ratio(pooledLag.MaxMs, pooledPut.MaxMs)),
	}
	title(out, "lag", "%d shards at %.0f MB/s in all, open loop, sealing every %d KiB onto a local replica, copied to a %s replica (%s) · %s in %d slices · %d parts of %d bytes (first)",
		shards, rateMBps, partBytes>>10, g.kind, g.endpoint, cfg.lagFor, rounds, pooledLag.Samples, len(obj))
	tw := newTable(out)
	fmt.Fprintln(tw, "contender\tsamples\tp50 ms\tp90 ms\tp99 ms\tmax ms\tp50 vs raw put\t")
	fmt.Fprintf(tw, "part committed on the local replica → on every replica\t%d\t%s\t%s\t%s\t%s\t%s\t\n", pooledLag.Samples,
		cell(pooledLag.P50Ms), cell(pooledLag.P90Ms), cell(pooledLag.P99Ms), num(pooledLag.MaxMs), vsP50)
	fmt.Fprintf(tw, "raw put of a real %d-byte part, same client, one per durable part\t%d\t%s\t%s\t%s\t%s\t1.00x\t\n", len(obj), pooledPut.Samples,
		cell(pooledPut.P50Ms), cell(pooledPut.P90Ms), cell(pooledPut.P99Ms), num(pooledPut.MaxMs))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out, `quantiles pooled over the slices, "-" where there were too few samples`)
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario:  "lag",
		Params:    map[string]any{"shards": shards, "rate_mb_per_s": rateMBps, "seal_bytes": partBytes, "seconds": cfg.lagFor.Seconds(), "slices": rounds, "part_bytes": len(obj)},
		Figures:   map[string]latencies{"part_committed_to_on_every_replica": pooledLag},
		Baselines: map[string]latencies{"raw_put_of_a_part": pooledPut},
		Ratios:    map[string]paired{"lag_p50_vs_raw_put_p50": vsP50},
		Targets:   targets,
	})
}
