package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/substrate"
)

// tailReincarnations is the reincarnation part of the tail scenario, per round,
// for each shard count: what a fence of the engine's tail stream (a takeover
// of another of its shards) costs while every shard is busy. The writes are the
// engine's object-store writes over a window that holds the fence, less those
// over a window of the same length without one, in the same round; the stall
// is the longest append ack in the fenced window over the longest in the other.
type tailReincarnations struct {
	shards []int
	writes [][]float64 // writes the fence added
	stall  [][]float64 // longest ack, fenced window, ms
	calm   [][]float64 // longest ack, window without a fence, ms
}

// reincarnationRound is one round at one shard count.
type reincarnationRound struct{ writes, stall, calm float64 }

func tailReincarnation(ctx context.Context, cfg config, root string, g *remote) (tailReincarnations, error) {
	res := tailReincarnations{shards: []int{1, 256}}
	settle, win := time.Second, time.Second
	if cfg.quick {
		settle = 200 * time.Millisecond
	}
	rec := [][]byte{make([]byte, 512)}
	prog := newProgress("tail", len(res.shards)*cfg.longRounds)
	rounds, err := runRounds(ctx, cfg.longRounds, len(res.shards), prog, func(r, i int) (reincarnationRound, error) {
		dir := filepath.Join(root, fmt.Sprintf("tail-reincarnation-%d-%d", r, i))
		defer os.RemoveAll(dir)
		clients, err := g.clients(ctx, 2) // the engine's, and a takeover's on another machine
		if err != nil {
			return reincarnationRound{}, err
		}
		defer g.discard(ctx, clients[0])
		e, shards, err := tailEngine(ctx, dir, clients[0], res.shards[i], "tail")
		if err != nil {
			return reincarnationRound{}, err
		}
		defer e.Close()
		// Closed loop, one appender per shard: every shard is busy in every
		// flush, and has an append waiting when the fence comes.
		var (
			mu     sync.Mutex
			acks   []ack
			failed error
		)
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, sh := range shards {
			wg.Go(func() {
				for runCtx.Err() == nil {
					start := time.Now()
					_, err := sh.Append(runCtx, rec...)
					end := time.Now()
					mu.Lock()
					if err != nil && runCtx.Err() == nil {
						failed = err
					}
					acks = append(acks, ack{start, end})
					mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
		writes := func() float64 {
			st := clients[0].Stats()
			return float64(st.Total(substrate.OpPutIfAbsent) + st.Total(substrate.OpCompareAndSwap) + st.Total(substrate.OpPut))
		}
		time.Sleep(settle)
		calmStart, calmWrites := time.Now(), writes()
		time.Sleep(win)
		calmEnd, calmW := time.Now(), writes()-calmWrites
		fenceAt, fencedWrites := time.Now(), writes()
		if err := fenceLive(ctx, clients[1], e.Instance()); err != nil {
			cancel()
			wg.Wait()
			return reincarnationRound{}, err
		}
		time.Sleep(win)
		fencedEnd, fencedW := time.Now(), writes()-fencedWrites
		cancel()
		wg.Wait()
		if failed != nil {
			return reincarnationRound{}, fmt.Errorf("an append across the reincarnation: %w", failed)
		}
		return reincarnationRound{
			writes: fencedW - calmW,
			stall:  longestAck(acks, fenceAt, fencedEnd),
			calm:   longestAck(acks, calmStart, calmEnd),
		}, nil
	})
	prog.done()
	if err != nil {
		return res, err
	}
	for _, rs := range rounds {
		var w, s, c []float64
		for _, r := range rs {
			w, s, c = append(w, r.writes), append(s, r.stall), append(c, r.calm)
		}
		res.writes, res.stall, res.calm = append(res.writes, w), append(res.stall, s), append(res.calm, c)
	}
	return res, nil
}

// ack is one append's call and return.
type ack struct{ start, end time.Time }

// longestAck is the longest ack, in ms, of the appends that returned in [from, to).
func longestAck(acks []ack, from, to time.Time) float64 {
	var most time.Duration
	for _, a := range acks {
		if !a.end.Before(from) && a.end.Before(to) {
			most = max(most, a.end.Sub(a.start))
		}
	}
	return ms(most)
}

// fenceLive fences instance's live tail incarnation on b, as the takeover of one
// of its shards does after marking it.
func fenceLive(ctx context.Context, b *substrate.Bucket, instance string) error {
	c, _, err := tail.ReadChain(ctx, b, instance)
	if err != nil {
		return err
	}
	live, ok := c.Live()
	if !ok {
		return fmt.Errorf("instance %s has no live tail incarnation", instance)
	}
	_, _, err = tail.Fence(ctx, b, instance, live.N, 0)
	return err
}

// reincarnationFigures are the figures and targets of a tailReincarnations.
func (r tailReincarnations) rows() (lines []string, figures map[string]spread, targets []target) {
	figures = map[string]spread{}
	for i, n := range r.shards {
		lines = append(lines,
			fmt.Sprintf("a fence's object-store writes, %d busy shards (fenced window less a calm one)\t%s\t-\t-\t", n, spreadOf(r.writes[i])),
			fmt.Sprintf("longest append ack ms across the fence · in a calm window, %d busy shards\t%s\t%s\t%s\t", n, spreadOf(r.stall[i]), spreadOf(r.calm[i]), pairRatios(r.stall[i], r.calm[i])))
		figures[fmt.Sprintf("reincarnation_writes_%d_shards", n)] = spreadOf(r.writes[i])
		figures[fmt.Sprintf("reincarnation_stall_ms_%d_shards", n)] = spreadOf(r.stall[i])
	}
	last := len(r.shards) - 1
	var more []float64
	for k := range r.writes[last] {
		more = append(more, r.writes[last][k]-r.writes[0][k])
	}
	targets = append(targets, atMost(fmt.Sprintf("writes a fence adds at %d shards less at %d", r.shards[last], r.shards[0]), 2, slices.Clone(more)...))
	return lines, figures, targets
}
