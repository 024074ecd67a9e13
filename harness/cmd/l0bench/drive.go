package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// appendParams describe one append workload: appenders goroutines, each appending
// batches of batch records of recordSize bytes.
type appendParams struct {
	appenders  int
	recordSize int
	batch      int
	// size is the bytes of a batch when its records are not all recordSize (the
	// JSON events of mixed and lag); 0: recordSize * batch.
	size int
}

func (p appendParams) batchBytes() int {
	if p.size > 0 {
		return p.size
	}
	return p.recordSize * p.batch
}

// sized returns p with the size of the batch recs.
func (p appendParams) sized(recs [][]byte) appendParams {
	p.size = 0
	for _, r := range recs {
		p.size += len(r)
	}
	return p
}

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

// timing is how a run is measured: it warms up (see warmedUp), at most maxWarmup,
// then measures for window.
type timing struct {
	warmup, maxWarmup, window time.Duration
	// warmupBytes is how much a contender whose state grows with what it is given
	// (l0, pebble) must have acknowledged before its window opens: enough for
	// pebble's memtable flushes and compactions to fall into their rhythm (its write
	// stalls start after about 1.5 GB on these machines), for l0's WAL to pass its
	// 256 MiB seal trigger several times, and for pebble's wal to recycle.
	warmupBytes int64
}

// warmedUp reports whether a run of s that has gone on for elapsed, with acked
// bytes acknowledged, is warm: past the warm-up time, past warmupBytes if s grows
// state, and for l0 once it has sealed.
func (t timing) warmedUp(s *sink, elapsed time.Duration, acked int64) bool {
	switch {
	case elapsed < t.warmup:
		return false
	case s.warmBytes && acked < t.warmupBytes:
		return false
	case s.l0 != nil && s.l0.sealState().seals == 0:
		return false
	}
	return true
}

// window is what one run of a contender did inside its measurement window.
type window struct {
	ops     int   // appends acknowledged in the window
	bytes   int64 // their bytes
	elapsed time.Duration
	lat     []time.Duration // their ack latencies
	fsyncs  uint64
	// writeTime and syncTime are the writer's time in its writes and fsyncs in the
	// window (-1 where it does not say).
	writeTime, syncTime time.Duration
	warmup              time.Duration // how long the run warmed up
	capped              bool          // the warm-up ended at maxWarmup, not warm
	// For l0: what it sealed in the window and what it left unsealed.
	sealed, appended         uint64 // record bytes
	backlogStart, backlogEnd uint64
	seals                    uint64 // in the window
	sealedBefore             uint64 // seals before the window: the warm-up's
	// diskBytes is what the data's device wrote in the window (-1 where the
	// system does not say): over bytes, how many times the contender writes what
	// it acknowledges, its journal's and metadata's writes included.
	diskBytes int64
	// cpu is the CPU time the process used in the window (-1 where unknown).
	cpu time.Duration
}

// diskPerAppended is the bytes the device wrote in the window over the bytes
// acknowledged in it; 0 where unknown.
func (w window) diskPerAppended() float64 {
	if w.diskBytes < 0 {
		return 0
	}
	return ratio(float64(w.diskBytes), float64(w.bytes))
}

func (w window) mbps() float64 { return mbps(w.bytes, w.elapsed) }

// cpuMsPerMB is the CPU time the process spent per MB acknowledged in the
// window; 0 where unknown.
func (w window) cpuMsPerMB() float64 {
	if w.cpu < 0 || w.bytes == 0 {
		return 0
	}
	return msPerMB(w.cpu, w.bytes)
}

// coresBusy is the CPU time used in the window over its length.
func (w window) coresBusy() float64 {
	if w.cpu < 0 {
		return 0
	}
	return ratio(w.cpu.Seconds(), w.elapsed.Seconds())
}

// appendsPerSync is the group commit: acknowledged appends per fsync.
func (w window) appendsPerSync() float64 {
	if w.fsyncs == 0 {
		return 0
	}
	return float64(w.ops) / float64(w.fsyncs)
}

// groupMs is the window's length over its fsyncs: how often a group committed.
func (w window) groupMs() float64 {
	if w.fsyncs == 0 {
		return 0
	}
	return ms(w.elapsed) / float64(w.fsyncs)
}

// perGroupMs is d, a time in the window, per fsync; -1 where unknown.
func (w window) perGroupMs(d time.Duration) float64 {
	if d < 0 || w.fsyncs == 0 {
		return -1
	}
	return ms(d) / float64(w.fsyncs)
}

func (w window) writeMs() float64 { return w.perGroupMs(w.writeTime) }
func (w window) fsyncMs() float64 { return w.perGroupMs(w.syncTime) }

// sealedShare is the record bytes sealed in the window over those appended in it:
// about 1 when seals keep pace with appends.
func (w window) sealedShare() float64 { return ratio(float64(w.sealed), float64(w.appended)) }

// measureWindow runs the warm-up and then the window of t beside the load, whose
// acknowledged bytes acked counts, and returns the window's bounds and how the
// warm-up went; snap is called at both ends of the window. A zero start means the
// run failed or was cancelled.
func measureWindow(ctx context.Context, s *sink, t timing, acked *atomic.Int64, snap func(end bool), failed <-chan struct{}) (start, end time.Time, warm time.Duration, capped bool) {
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
	for !t.warmedUp(s, time.Since(begin), acked.Load()) {
		if time.Since(begin) >= t.maxWarmup {
			capped = true
			break
		}
		// Poll every 20 ms, or at the end of the minimum warm-up if sooner; never
		// spin, which would take a core from the contender warming up.
		d := t.warmup - time.Since(begin)
		if d <= 0 || d > 20*time.Millisecond {
			d = 20 * time.Millisecond
		}
		if !sleep(d) {
			return
		}
	}
	snap(false)
	start, warm = time.Now(), time.Since(begin)
	if !sleep(t.window) {
		return time.Time{}, time.Time{}, 0, false
	}
	snap(true)
	return start, time.Now(), warm, capped
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
		acked    atomic.Int64
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
				acked.Add(int64(p.batchBytes()))
				if t1 := time.Now().UnixNano(); t1 >= winStart.Load() && t1 < winEnd.Load() {
					lats[a] = append(lats[a], time.Since(t0))
				}
			}
		})
	}
	var before window
	snap := func(end bool) {
		v := window{diskBytes: -1, cpu: -1, writeTime: -1, syncTime: -1}
		if n, ok := diskWritten(); ok {
			v.diskBytes = n
		}
		if c, ok := cpuUsed(); ok {
			v.cpu = c
		}
		if s.syncs != nil {
			c := s.syncs()
			v.fsyncs, v.writeTime, v.syncTime = c.fsyncs, c.write, c.sync
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
		w.diskBytes, w.cpu, w.writeTime, w.syncTime = -1, -1, -1, -1
		if v.writeTime >= 0 && before.writeTime >= 0 {
			w.writeTime = v.writeTime - before.writeTime
		}
		if v.syncTime >= 0 && before.syncTime >= 0 {
			w.syncTime = v.syncTime - before.syncTime
		}
		if v.diskBytes >= 0 && before.diskBytes >= 0 {
			w.diskBytes = v.diskBytes - before.diskBytes
		}
		if v.cpu >= 0 && before.cpu >= 0 {
			w.cpu = v.cpu - before.cpu
		}
	}
	start, end, warm, capped := measureWindow(ctx, s, t, &acked, snap, failed)
	close(stop)
	wg.Wait()
	if firstErr != nil {
		return window{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return window{}, err
	}
	if start.IsZero() {
		return window{}, errors.New("the run ended before its window")
	}
	w.elapsed, w.warmup, w.capped = end.Sub(start), warm, capped
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
	// schedP99 is the p99 of how long the process's goroutines waited for a core
	// over the run (the runtime's histogram, to its bucket's bound); ok is false
	// with too few waits.
	schedP99   time.Duration
	schedP99OK bool
}

// runOpen offers load to s open-loop at rate MB/s in all: appender a's appends are
// due at fixed times, every p.appenders batches' worth of the rate apart, staggered
// over the appenders; each append's latency runs from when it was due, so a stall
// is not hidden by appenders that slowed down. It runs for settle, then measures
// the appends due in the next window (waiting for the last of them).
func runOpen(ctx context.Context, s *sink, p appendParams, rate float64, settle, win time.Duration) (openLoop, error) {
	interval := time.Duration(float64(time.Second) * float64(p.batchBytes()) * float64(p.appenders) / (rate * 1e6))
	sched := readSchedLatencies()
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
	schedP99, schedOK := readSchedLatencies().quantileSince(sched, 0.99)
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return openLoop{}, fmt.Errorf("no append due in the window at %.1f MB/s", rate)
	}
	return openLoop{
		offered:  rate,
		achieved: mbps(int64(len(all))*int64(p.batchBytes()), max(win, time.Unix(0, lastAck.Load()).Sub(from))),
		lat:      all,
		late:     slices.Concat(lates...),
		schedP99: schedP99, schedP99OK: schedOK,
	}, nil
}

// removeAndSync removes dir and then writes back every dirty page of the machine
// and commits the file system's journal, so that the next contender starts on a
// quiet disk. Without it, the next run pays for this one: the writeback it left
// running, and the journal commit of the removal, which on a file system mounted
// with online discard trims every block of the gigabytes just removed inside the
// next contender's first fsync, making a paired round measure the order it ran in.
func removeAndSync(dir string) {
	os.RemoveAll(dir)
	syscall.Sync()
}
