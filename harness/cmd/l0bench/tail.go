package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/api/option"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/gcs"
)

// The tail scenario's load: a flush interval's worth of appends is one tail object.
const (
	tailInterval = 50 * time.Millisecond
	tailShards   = 8
)

// tailScenario measures the remote tail on the remote emulator, in three parts:
//   - latency: Remote-mode appends offered open-loop, ack p50/p99, beside puts of
//     objects of a flush's size to the same emulator; the bound is half the flush
//     interval (the wait for the next flush, on average) plus 1.5x the put;
//   - puts: tail puts per second with 1, 64 and 1,024 busy shards under the same
//     appenders, which must not grow with the shards;
//   - move: a shard's 2.5 MB tail left by Retire, opened on another machine (its
//     own Dir and client) until sealed, beside the same move to the same Dir.
func tailScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	lat, err := tailLatency(ctx, cfg, root, g)
	if err != nil {
		return fmt.Errorf("tail latency: %w", err)
	}
	puts, err := tailPuts(ctx, cfg, root, g)
	if err != nil {
		return fmt.Errorf("tail puts: %w", err)
	}
	move, err := tailMove(ctx, cfg, root, g)
	if err != nil {
		return fmt.Errorf("tail move: %w", err)
	}
	reinc, err := tailReincarnation(ctx, cfg, root, g)
	if err != nil {
		return fmt.Errorf("tail reincarnation: %w", err)
	}
	reincRows, reincFigures, reincTargets := reinc.rows()

	title(out, "tail", "Remote mode on %s %s, flush interval %s · %d rounds, order rotated · median (min-max)",
		g.kind, g.endpoint, tailInterval, cfg.longRounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tl0\tbaseline\tratio\t")
	fmt.Fprintf(tw, "append ack p50 ms, %.0f MB/s offered open-loop over %d shards · put of a %.0f KB object\t%s\t%s\t%s (of the bound)\t\n",
		lat.offered, tailShards, float64(lat.objectBytes)/1e3, presentSpread(lat.l0P50), presentSpread(lat.putP50), lat.vsBound)
	fmt.Fprintf(tw, "append ack p99 ms · put p99 ms\t%s\t%s\t%s\t\n", presentSpread(lat.l0P99), presentSpread(lat.putP99), pairRatios(lat.l0P99, lat.putP99))
	for i, n := range puts.shards {
		fmt.Fprintf(tw, "tail puts/s, %d busy shards, %d appenders\t%s\t-\t%s (vs 1 shard)\t\n", n, puts.appenders, spreadOf(puts.rates[i]), pairRatios(puts.rates[i], puts.rates[0]))
	}
	fmt.Fprintf(tw, "%.1f MB tail: OpenShard → sealed ms, another machine · the same Dir\t%s\t%s\t%s\t\n",
		float64(move.raw)/1e6, spreadOf(move.cross), spreadOf(move.same), move.vs)
	for _, l := range reincRows {
		fmt.Fprintln(tw, l)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var spreads []float64
	for r := range puts.rates[0] {
		var vs []float64
		for i := range puts.shards {
			vs = append(vs, puts.rates[i][r])
		}
		spreads = append(spreads, slices.Max(vs)/slices.Min(vs))
	}
	targets := []target{
		lat.target,
		atMost("tail puts/s, the most over the fewest of the busy shard counts", 1.2, spreads...),
		atMost("cross-machine move over the same-machine move", 2, move.vs.PerRound...),
	}
	targets = append(targets, reincTargets...)
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out)
	figures := map[string]spread{
		"ack_p50_ms": presentSpread(lat.l0P50), "ack_p99_ms": presentSpread(lat.l0P99),
		"move_cross_machine_ms": spreadOf(move.cross),
	}
	for i, n := range puts.shards {
		figures[fmt.Sprintf("tail_puts_per_s_%d_shards", n)] = spreadOf(puts.rates[i])
	}
	maps.Copy(figures, reincFigures)
	return emit(results, resultLine{
		Scenario: "tail",
		Params: map[string]any{"substrate": g.kind, "flush_interval_ms": ms(tailInterval), "rounds": cfg.longRounds,
			"offered_mb_per_s": lat.offered, "object_bytes": lat.objectBytes, "move_raw_bytes": move.raw, "appenders": puts.appenders},
		Figures: figures,
		Baselines: map[string]map[string]spread{
			"raw_put_same_size": {"p50_ms": presentSpread(lat.putP50), "p99_ms": presentSpread(lat.putP99)},
			"same_machine_move": {"ms": spreadOf(move.same)},
		},
		Ratios:  map[string]paired{"ack_p50_vs_bound": lat.vsBound, "move_cross_vs_same": move.vs},
		Targets: targets,
	})
}

// tailLatencies is what the latency part measured, per round.
type tailLatencies struct {
	offered        float64 // MB/s
	objectBytes    int     // a flush's worth of the offered load
	l0P50, l0P99   []float64
	putP50, putP99 []float64
	vsBound        paired // l0's p50 over interval/2 + 1.5x the put's p50
	target         target
}

func tailLatency(ctx context.Context, cfg config, root string, g *remote) (tailLatencies, error) {
	// An append waits for its flush, so an appender has one in flight per flush:
	// enough of them that the offered load never waits for an appender.
	p := appendParams{appenders: 256, recordSize: 1024, batch: 4}
	res := tailLatencies{offered: 5}
	res.objectBytes = int(res.offered * 1e6 * tailInterval.Seconds())
	settle, win := time.Second, 4*cfg.latencyWindow // 160 puts of the baseline, at 20 a second
	if cfg.quick {
		settle = 200 * time.Millisecond
	}
	prog := newProgress("tail", 2*cfg.longRounds)
	rounds, err := runRounds(ctx, cfg.longRounds, 2, prog, func(r, i int) ([]time.Duration, error) {
		if i == 1 {
			return rawPuts(ctx, g, res.objectBytes, win)
		}
		dir := filepath.Join(root, fmt.Sprintf("tail-latency-%d", r))
		defer os.RemoveAll(dir)
		bucket, err := g.newBucket(ctx)
		if err != nil {
			return nil, err
		}
		defer g.discard(ctx, bucket)
		e, shards, err := tailEngine(ctx, dir, bucket, tailShards, "tail")
		if err != nil {
			return nil, err
		}
		defer e.Close()
		payloads := p.payloads()
		s := &sink{append: appendTo(ctx, shards, func(w int) [][]byte { return payloads[w] })}
		run, err := runOpen(ctx, s, p, res.offered, settle, win)
		return run.lat, err
	})
	prog.done()
	if err != nil {
		return res, err
	}
	res.l0P50, res.l0P99 = roundQuantiles(rounds[0], 0.5), roundQuantiles(rounds[0], 0.99)
	res.putP50, res.putP99 = roundQuantiles(rounds[1], 0.5), roundQuantiles(rounds[1], 0.99)
	bounds := each(res.putP50, func(put float64) float64 {
		if put == 0 {
			return 0
		}
		return ms(tailInterval)/2 + 1.5*put
	})
	res.vsBound = pairRatios(res.l0P50, bounds)
	res.target = bounded("append ack p50 over flush interval/2 + 1.5x a raw put's p50", 1, res.vsBound.PerRound, "too few samples")
	return res, nil
}

// rawPuts puts objects of size bytes to a new bucket on g at the tail's cadence,
// one a flush interval, for win, and returns their latencies. Each is deleted
// after it is timed, so that an in-process emulator does not hold them all.
func rawPuts(ctx context.Context, g *remote, size int, win time.Duration) ([]time.Duration, error) {
	bucket, err := g.newBucket(ctx)
	if err != nil {
		return nil, err
	}
	defer g.discard(ctx, bucket)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var lat []time.Duration
	t := time.NewTicker(tailInterval)
	defer t.Stop()
	for start, i := time.Now(), 0; time.Since(start) < win; i++ {
		key := fmt.Sprintf("raw/%08d", i)
		t0 := time.Now()
		if _, _, err := bucket.PutIfAbsentBytes(ctx, key, data); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
		if err := bucket.Delete(ctx, key); err != nil {
			return nil, err
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return lat, nil
}

// tailEngine opens a Remote-mode engine in dir on bucket, which holds its tail,
// and n shards on it.
func tailEngine(ctx context.Context, dir string, bucket *substrate.Bucket, n int, label string) (*engine.Engine, []*shard.Shard, error) {
	e, err := engine.Open(ctx, engine.Options{Durability: engine.Remote, Dir: dir, Bucket: bucket, Seal: quietSeal(),
		Tail: engine.TailOptions{Interval: tailInterval}, Registerer: engineRegisterer(label)})
	if err != nil {
		return nil, nil, err
	}
	shards, err := openConcurrently(ctx, e, label, n)
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	return e, shards, nil
}

// openConcurrently opens shards label-0 to label-(n-1) on e, 32 at a time.
func openConcurrently(ctx context.Context, e *engine.Engine, label string, n int) ([]*shard.Shard, error) {
	out := make([]*shard.Shard, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range out {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = e.OpenShard(ctx, fmt.Sprintf("%s-%d", label, i))
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// tailPutRates is the puts part: puts per second for each shard count, per round.
type tailPutRates struct {
	shards    []int
	appenders int
	rates     [][]float64
}

func tailPuts(ctx context.Context, cfg config, root string, g *remote) (tailPutRates, error) {
	res := tailPutRates{shards: []int{1, 64, 1024}, appenders: 1024}
	settle, win := time.Second, 3*time.Second
	if cfg.quick {
		res.shards, res.appenders = []int{1, 8, 64}, 64
		settle, win = 200*time.Millisecond, time.Second
	}
	rec := [][]byte{make([]byte, 512)}
	prog := newProgress("tail", len(res.shards)*cfg.longRounds)
	rounds, err := runRounds(ctx, cfg.longRounds, len(res.shards), prog, func(r, i int) (float64, error) {
		dir := filepath.Join(root, fmt.Sprintf("tail-puts-%d-%d", r, i))
		defer os.RemoveAll(dir)
		bucket, err := g.newBucket(ctx)
		if err != nil {
			return 0, err
		}
		defer g.discard(ctx, bucket)
		e, shards, err := tailEngine(ctx, dir, bucket, res.shards[i], "tail")
		if err != nil {
			return 0, err
		}
		defer e.Close()
		// Closed loop: each appender waits for its flush, then appends again, so
		// every shard is busy in every flush.
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var failed error
		var mu sync.Mutex
		for a := range res.appenders {
			wg.Go(func() {
				for runCtx.Err() == nil {
					if _, err := shards[a%len(shards)].Append(runCtx, rec...); err != nil && runCtx.Err() == nil {
						mu.Lock()
						failed = err
						mu.Unlock()
						return
					}
				}
			})
		}
		time.Sleep(settle)
		before, start := e.Metrics().TailPuts, time.Now()
		time.Sleep(win)
		puts, took := e.Metrics().TailPuts-before, time.Since(start)
		cancel()
		wg.Wait()
		if failed != nil {
			return 0, failed
		}
		return float64(puts) / took.Seconds(), nil
	})
	prog.done()
	res.rates = rounds
	return res, err
}

// tailMoves is the move part, per round.
type tailMoves struct {
	raw         int64
	cross, same []float64 // ms from OpenShard to the backlog sealed
	vs          paired
}

func tailMove(ctx context.Context, cfg config, root string, g *remote) (tailMoves, error) {
	recs := events(recordsFor(cfg.inheritedMB), recordSize, 2)
	res := tailMoves{}
	for _, r := range recs {
		res.raw += int64(len(r))
	}
	prog := newProgress("tail", 2*cfg.rounds)
	rounds, err := runRounds(ctx, cfg.rounds, 2, prog, func(r, i int) (float64, error) {
		d, err := runMove(ctx, filepath.Join(root, fmt.Sprintf("tail-move-%d-%d", r, i)), g, recs, i == 0)
		return ms(d), err
	})
	prog.done()
	if err != nil {
		return res, err
	}
	res.cross, res.same = rounds[0], rounds[1]
	res.vs = pairRatios(res.cross, res.same)
	return res, nil
}

// runMove leaves recs in a shard's tail on machine A (Retire), and times the open
// of the shard until its backlog is sealed: on machine B, with a Dir and a client
// of its own (cross), or on A's Dir again.
func runMove(ctx context.Context, dir string, g *remote, recs [][]byte, cross bool) (time.Duration, error) {
	defer os.RemoveAll(dir)
	clients, err := g.clients(ctx, 2)
	if err != nil {
		return 0, err
	}
	defer g.discard(ctx, clients[0])
	defer clients[1].Close()
	dirA := filepath.Join(dir, "a")
	e, err := engine.Open(ctx, engine.Options{Durability: engine.Local, Dir: dirA, Bucket: clients[0], Seal: quietSeal(), Registerer: engineRegisterer("move")})
	if err != nil {
		return 0, err
	}
	sh, err := e.OpenShard(ctx, "moved")
	if err == nil {
		err = appendAll(ctx, sh, recs)
	}
	if err == nil {
		err = sh.Retire(ctx) // ships the tail, records its end
	}
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	openDir, bucket := dirA, clients[0]
	if cross {
		openDir, bucket = filepath.Join(dir, "b"), clients[1]
	}
	e, err = engine.Open(ctx, engine.Options{Dir: openDir, Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("move")})
	if err != nil {
		return 0, err
	}
	defer e.Close()
	start := time.Now()
	sh, err = e.OpenShard(ctx, "moved")
	if err != nil {
		return 0, err
	}
	for sh.Info().UnsealedBytes > 0 || sh.Info().Sealed < uint64(len(recs)) {
		if time.Since(start) > time.Minute {
			return 0, fmt.Errorf("the moved backlog was not sealed within a minute")
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start), nil
}

// clients returns n buckets on one new bucket of g, each with a client of its own,
// as n machines have. S3 buckets share one client.
func (g *remote) clients(ctx context.Context, n int) ([]*substrate.Bucket, error) {
	if g.kind != "gcs" {
		b, err := g.newBucket(ctx)
		if err != nil {
			return nil, err
		}
		return slices.Repeat([]*substrate.Bucket{b}, n), nil
	}
	first, name, err := g.newGCSBucket(ctx)
	if err != nil {
		return nil, err
	}
	out := []*substrate.Bucket{first}
	for len(out) < n {
		d, err := gcs.Open(ctx, gcs.Config{Bucket: name, Endpoint: g.endpoint, ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
		if err != nil {
			return nil, err
		}
		b, err := substrate.New(d, substrate.Options{Name: first.Name()})
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
