package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// appendParams describe one append workload: appenders goroutines, each appending
// batches of batch records of recordSize bytes.
type appendParams struct {
	appenders  int
	recordSize int
	batch      int
}

func (p appendParams) batchBytes() int { return p.recordSize * p.batch }

// payloads returns one batch of records per appender, random so nothing downstream
// compresses it away.
func (p appendParams) payloads() [][][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([][][]byte, p.appenders)
	for w := range out {
		out[w] = make([][]byte, p.batch)
		for i := range out[w] {
			r := make([]byte, p.recordSize)
			for j := range r {
				r[j] = byte(rng.Uint32())
			}
			out[w][i] = r
		}
	}
	return out
}

// timing is how a run is measured: it warms up for warmup — and an l0 run until it
// has sealed something too, at most maxWarmup in all — then measures for window.
type timing struct {
	warmup, maxWarmup, window time.Duration
}

// window is what one run of a contender did inside its measurement window.
type window struct {
	ops     int   // appends acknowledged in the window
	bytes   int64 // their bytes
	elapsed time.Duration
	lat     []time.Duration // their ack latencies
	fsyncs  uint64
	warmup  time.Duration // how long the run warmed up
	// For l0: what it sealed in the window and what it left unsealed.
	sealed, appended         uint64 // record bytes
	backlogStart, backlogEnd uint64
	seals                    uint64 // in the window
	sealedBefore             uint64 // seals before the window: the warm-up's
}

func (w window) mbps() float64 { return mbps(w.bytes, w.elapsed) }

// appendsPerSync is the group commit: acknowledged appends per fsync.
func (w window) appendsPerSync() float64 {
	if w.fsyncs == 0 {
		return 0
	}
	return float64(w.ops) / float64(w.fsyncs)
}

// sealedShare is the record bytes sealed in the window over those appended in it:
// about 1 when seals keep pace with appends.
func (w window) sealedShare() float64 { return ratio(float64(w.sealed), float64(w.appended)) }

// measureWindow runs the warm-up and then the window of t beside load, which runs
// until stop is closed, and returns the window's bounds; snap is called at both
// ends of the window.
func measureWindow(ctx context.Context, s *sink, t timing, snap func(end bool), failed <-chan struct{}) (start, end time.Time, warm time.Duration) {
	begin := time.Now()
	sleep := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-failed:
			return false
		case <-ctx.Done():
			return false
		}
	}
	if !sleep(t.warmup) {
		return
	}
	if s.l0 != nil {
		for s.l0.sealState().seals == 0 && time.Since(begin) < t.maxWarmup {
			if !sleep(20 * time.Millisecond) {
				return
			}
		}
	}
	snap(false)
	start, warm = time.Now(), time.Since(begin)
	if !sleep(t.window) {
		return time.Time{}, time.Time{}, 0
	}
	snap(true)
	return start, time.Now(), warm
}

// runClosed has p.appenders appenders append to s back to back, each as soon as its
// previous append returned, and measures the window of t.
func runClosed(ctx context.Context, s *sink, p appendParams, t timing) (window, error) {
	var (
		w        window
		winStart atomic.Int64
		winEnd   atomic.Int64
		stop     = make(chan struct{})
		failed   = make(chan struct{})
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
		lats     = make([][]time.Duration, p.appenders)
	)
	winStart.Store(1 << 62)
	winEnd.Store(1 << 62)
	for a := range p.appenders {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				if err := s.append(a); err != nil {
					errOnce.Do(func() { firstErr = err; close(failed) })
					return
				}
				if t1 := time.Now().UnixNano(); t1 >= winStart.Load() && t1 < winEnd.Load() {
					lats[a] = append(lats[a], time.Since(t0))
				}
			}
		})
	}
	var before window
	snap := func(end bool) {
		v := window{}
		if s.syncs != nil {
			v.fsyncs = s.syncs()
		}
		if s.l0 != nil {
			st := s.l0.sealState()
			v.sealed, v.appended, v.backlogStart, v.seals = st.sealedBytes, st.appendedBytes, st.backlog, st.seals
		}
		if !end {
			before = v
			winStart.Store(time.Now().UnixNano())
			return
		}
		winEnd.Store(time.Now().UnixNano())
		w.fsyncs, w.sealed, w.appended = v.fsyncs-before.fsyncs, v.sealed-before.sealed, v.appended-before.appended
		w.backlogStart, w.backlogEnd, w.seals, w.sealedBefore = before.backlogStart, v.backlogStart, v.seals-before.seals, before.seals
	}
	start, end, warm := measureWindow(ctx, s, t, snap, failed)
	close(stop)
	wg.Wait()
	if firstErr != nil {
		return window{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return window{}, err
	}
	w.elapsed, w.warmup = end.Sub(start), warm
	w.lat = slices.Concat(lats...)
	w.ops = len(w.lat)
	w.bytes = int64(w.ops) * int64(p.batchBytes())
	if w.ops == 0 {
		return window{}, errors.New("no append was acknowledged in the window")
	}
	return w, nil
}

// openLoop is what an open-loop load level measured.
type openLoop struct {
	offered  float64         // MB/s
	achieved float64         // MB/s: the appends due in the window over the time until the last of them was acknowledged
	lat      []time.Duration // from each append's due time to its ack
	late     []time.Duration // how late the generator's timers woke
}

// runOpen offers load to s open-loop at rate MB/s in all: appender a's appends are
// due at fixed times, every p.appenders batches' worth of the rate apart, staggered
// over the appenders; each append's latency runs from when it was due, so a stall
// is not hidden by appenders that slowed down. It runs for settle, then measures
// the appends due in the next window (waiting for the last of them).
func runOpen(ctx context.Context, s *sink, p appendParams, rate float64, settle, win time.Duration) (openLoop, error) {
	interval := time.Duration(float64(time.Second) * float64(p.batchBytes()) * float64(p.appenders) / (rate * 1e6))
	begin := time.Now().Add(5 * time.Millisecond)
	from, to := begin.Add(settle), begin.Add(settle+win)
	lats := make([][]time.Duration, p.appenders)
	lates := make([][]time.Duration, p.appenders)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	var lastAck atomic.Int64
	for a := range p.appenders {
		wg.Go(func() {
			for due := begin.Add(interval * time.Duration(a) / time.Duration(p.appenders)); due.Before(to); due = due.Add(interval) {
				if ctx.Err() != nil || failed.Load() != nil {
					return
				}
				measured := !due.Before(from)
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
					if measured {
						lates[a] = append(lates[a], time.Since(due))
					}
				}
				if err := s.append(a); err != nil {
					failed.Store(&err)
					return
				}
				if measured {
					now := time.Now()
					lats[a] = append(lats[a], now.Sub(due))
					for last := lastAck.Load(); now.UnixNano() > last && !lastAck.CompareAndSwap(last, now.UnixNano()); last = lastAck.Load() {
					}
				}
			}
		})
	}
	wg.Wait()
	if errp := failed.Load(); errp != nil {
		return openLoop{}, *errp
	}
	if err := ctx.Err(); err != nil {
		return openLoop{}, err
	}
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return openLoop{}, fmt.Errorf("no append due in the window at %.1f MB/s", rate)
	}
	return openLoop{
		offered:  rate,
		achieved: mbps(int64(len(all))*int64(p.batchBytes()), max(win, time.Unix(0, lastAck.Load()).Sub(from))),
		lat:      all,
		late:     slices.Concat(lates...),
	}, nil
}
