package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/shard"
)

// readerScenario measures the leaseless Reader on the remote emulator, in two
// parts:
//   - staleness: an owner appends one 1 KiB record every 10 ms to a shard, and a
//     Reader on another machine (its own client) follows it; for each record, the
//     time from its append's start to the Reader yielding it, beside the append's
//     own ack, in Local and Remote mode. Its bound is about one flush interval
//     (Local: the tail ships after the ack) plus one poll and one pass of requests;
//   - idle: a Reader following a shard whose owner appends nothing, its requests
//     per second counted at its own client, beside the polls per second.
func readerScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	modes := []engine.Durability{engine.Local, engine.Remote}
	prog := newProgress("reader", (len(modes)+1)*cfg.longRounds)
	rounds, err := runRounds(ctx, cfg.longRounds, len(modes)+1, prog, func(r, i int) (readerRun, error) {
		dir := filepath.Join(root, fmt.Sprintf("reader-%d-%d", r, i))
		defer os.RemoveAll(dir)
		if i == len(modes) {
			return readerIdle(ctx, cfg, dir, g)
		}
		return readerStaleness(ctx, cfg, dir, g, modes[i])
	})
	prog.done()
	if err != nil {
		return err
	}
	title(out, "reader", "a Reader on another machine following one shard on %s, polling every %s (the flush interval) · %d rounds, order rotated · median (min-max)", g.kind, tailInterval, cfg.longRounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tl0\tbaseline\tratio\t")
	figures := map[string]spread{}
	var targets []target
	for i, mode := range modes {
		var ack, seen [][]time.Duration
		for _, run := range rounds[i] {
			ack, seen = append(ack, run.ack), append(seen, run.seen)
		}
		ackP50, seenP50, seenP99 := roundQuantiles(ack, 0.5), roundQuantiles(seen, 0.5), roundQuantiles(seen, 0.99)
		bound := each(ackP50, func(v float64) float64 {
			if v == 0 {
				return 0
			}
			if mode == engine.Local { // shipped after the ack
				return v + 2*ms(tailInterval)
			}
			return v + ms(tailInterval)
		})
		vs := pairRatios(seenP50, bound)
		fmt.Fprintf(tw, "%s: append start → the Reader yields it, p50 ms · the ack p50 + %s\t%s\t%s\t%s\t\n", mode, map[bool]string{true: "2 flush intervals", false: "1 flush interval"}[mode == engine.Local], presentSpread(seenP50), presentSpread(bound), vs)
		fmt.Fprintf(tw, "%s: the same, p99 ms · the ack p50\t%s\t%s\t-\t\n", mode, presentSpread(seenP99), presentSpread(ackP50))
		figures["seen_p50_ms_"+mode.String()], figures["seen_p99_ms_"+mode.String()] = presentSpread(seenP50), presentSpread(seenP99)
		targets = append(targets, bounded(fmt.Sprintf("%s: a Reader's staleness p50 within its bound", mode), 1, vs.PerRound, "too few samples"))
	}
	var rps, polls []float64
	for _, run := range rounds[len(modes)] {
		rps, polls = append(rps, run.requestsPerSecond), append(polls, 1/tailInterval.Seconds())
	}
	fmt.Fprintf(tw, "an idle follower's requests per second · polls per second\t%s\t%s\t%s (per poll)\t\n", spreadOf(rps), spreadOf(polls), pairRatios(rps, polls))
	figures["idle_follower_requests_per_s"] = spreadOf(rps)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario:  "reader",
		Params:    map[string]any{"record_bytes": 1024, "every_ms": 10, "rounds": cfg.longRounds, "poll_ms": ms(tailInterval), "remote": g.kind},
		Figures:   figures,
		Baselines: map[string]map[string]spread{"polls": {"per_s": spreadOf(polls)}},
		Targets:   targets,
	})
}

// readerRun is one round of a part: latencies, or an idle follower's cost.
type readerRun struct {
	ack, seen         []time.Duration
	requestsPerSecond float64
}

func readerStaleness(ctx context.Context, cfg config, dir string, g *remote, mode engine.Durability) (readerRun, error) {
	clients, err := g.clients(ctx, 2) // the owner's, and the Reader's on another machine
	if err != nil {
		return readerRun{}, err
	}
	defer g.discard(ctx, clients[0])
	defer clients[1].Close()
	e, err := engine.Open(ctx, engine.Options{Durability: mode, Dir: dir, Bucket: clients[0], Tail: engine.TailOptions{Interval: tailInterval}, Registerer: engineRegisterer("reader")})
	if err != nil {
		return readerRun{}, err
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "read")
	if err != nil {
		return readerRun{}, err
	}
	r, err := engine.OpenReader(ctx, engine.ReaderOptions{Bucket: clients[1], Poll: tailInterval})
	if err != nil {
		return readerRun{}, err
	}
	defer r.Close()
	const most = 1 << 16
	started := make([]atomic.Int64, most)
	var seen []time.Duration // the follower's, until it ends
	var seenN atomic.Int64
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	followed := make(chan error, 1)
	go func() {
		var err error
		for rec, rerr := range r.Read(fctx, "read", 0, shard.Follow()) {
			if rerr != nil {
				err = rerr
				break
			}
			n := binary.BigEndian.Uint64(rec.Value)
			seen = append(seen, time.Since(time.Unix(0, started[n].Load())))
			seenN.Add(1)
		}
		followed <- err
	}()
	settle, win := time.Second, 2*cfg.latencyWindow
	if cfg.quick {
		settle = 200 * time.Millisecond
	}
	var run readerRun
	rec := make([]byte, 1024)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	begin := time.Now()
	n := 0
	for ; n < most && time.Since(begin) < settle+win; n++ {
		binary.BigEndian.PutUint64(rec, uint64(n))
		t0 := time.Now()
		started[n].Store(t0.UnixNano())
		if _, err := sh.Append(ctx, rec); err != nil {
			return readerRun{}, err
		}
		if t0.Sub(begin) >= settle {
			run.ack = append(run.ack, time.Since(t0))
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return readerRun{}, ctx.Err()
		}
	}
	// Wait for the Reader to see the last record: Local mode ships it within a
	// flush interval of its ack.
	deadline := time.Now().Add(10 * time.Second)
	for seenN.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-followed; err != nil && !errors.Is(err, context.Canceled) {
		return readerRun{}, fmt.Errorf("reader: the follower: %w", err)
	}
	if len(seen) != n {
		return readerRun{}, fmt.Errorf("reader: the Reader saw %d of the %d records", len(seen), n)
	}
	run.seen = seen[n-len(run.ack):]
	return run, nil
}

func readerIdle(ctx context.Context, cfg config, dir string, g *remote) (readerRun, error) {
	clients, err := g.clients(ctx, 2)
	if err != nil {
		return readerRun{}, err
	}
	defer g.discard(ctx, clients[0])
	defer clients[1].Close()
	e, err := engine.Open(ctx, engine.Options{Durability: engine.Remote, Dir: dir, Bucket: clients[0], Seal: quietSeal(), Tail: engine.TailOptions{Interval: tailInterval}, Registerer: engineRegisterer("reader")})
	if err != nil {
		return readerRun{}, err
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "idle")
	if err != nil {
		return readerRun{}, err
	}
	// A sealed part, then a few unsealed objects in the tail: what a shard that
	// went quiet holds.
	if err := appendAll(ctx, sh, [][]byte{[]byte("sealed")}); err != nil {
		return readerRun{}, err
	}
	if _, err := sh.Seal(ctx, 1<<40); err != nil {
		return readerRun{}, err
	}
	for i := range 3 {
		if _, err := sh.Append(ctx, fmt.Appendf(nil, "unsealed %d", i)); err != nil {
			return readerRun{}, err
		}
	}
	r, err := engine.OpenReader(ctx, engine.ReaderOptions{Bucket: clients[1], Poll: tailInterval})
	if err != nil {
		return readerRun{}, err
	}
	defer r.Close()
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	read := make(chan error, 1)
	var got atomic.Int64
	go func() {
		var err error
		for _, rerr := range r.Read(fctx, "idle", 0, shard.Follow()) {
			if rerr != nil {
				err = rerr
				break
			}
			got.Add(1)
		}
		read <- err
	}()
	for got.Load() < 4 {
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return readerRun{}, err
		}
	}
	win := 5 * time.Second
	if cfg.quick {
		win = time.Second
	}
	before, start := requests(clients[1]), time.Now()
	if err := sleep(ctx, win); err != nil {
		return readerRun{}, err
	}
	n, took := requests(clients[1])-before, time.Since(start)
	stop()
	if err := <-read; err != nil && !errors.Is(err, context.Canceled) {
		return readerRun{}, fmt.Errorf("reader: the idle follower: %w", err)
	}
	return readerRun{requestsPerSecond: float64(n) / took.Seconds()}, nil
}
