package sealer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/l0store/l0/seal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// target is a fake shard: its seals take hold, and fail with err when set.
type target struct {
	mu       sync.Mutex
	bytes    uint64
	oldest   time.Time
	hold     time.Duration
	err      error
	attempts atomic.Int32
	running  *atomic.Int32 // shared by targets to see the concurrency
	peak     *atomic.Int32
	order    *[]string
	id       string
	counters *Counters // where its seals are counted, as a shard's are
}

func (t *target) Unsealed() (uint64, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bytes, t.oldest
}

func (t *target) Seal(ctx context.Context, budget uint64) (res seal.Result, err error) {
	t.attempts.Add(1)
	if t.counters != nil {
		defer func() { t.counters.Observe(res, err) }()
	}
	if t.running != nil {
		n := t.running.Add(1)
		defer t.running.Add(-1)
		for p := t.peak.Load(); n > p && !t.peak.CompareAndSwap(p, n); p = t.peak.Load() {
		}
	}
	if t.order != nil {
		t.mu.Lock()
		*t.order = append(*t.order, t.id)
		t.mu.Unlock()
	}
	select {
	case <-time.After(t.hold):
	case <-ctx.Done():
		return seal.Result{}, errors.Join(ctx.Err(), ErrStopped)
	}
	if t.err != nil {
		return seal.Result{}, t.err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.bytes
	t.bytes, t.oldest = 0, time.Time{}
	return seal.Result{Records: n, RawBytes: n, Objects: 1}, nil
}

func newScheduler(t *testing.T, opts seal.Options) *Scheduler {
	t.Helper()
	s, err := NewScheduler(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%s: not within 5 s", what)
		}
	}
}

func TestTheWALTriggerSealsTheLargestShardsUntilTheRestIsUnder(t *testing.T) {
	var order []string
	s := newScheduler(t, seal.Options{SizeBytes: 1 << 40, WALBytes: 1000, Age: time.Hour, Concurrency: 1, Interval: 5 * time.Millisecond})
	sizes := map[string]uint64{"small": 100, "large": 700, "medium": 300}
	targets := map[string]*target{}
	for id, n := range sizes {
		targets[id] = &target{bytes: n, order: &order, id: id, counters: s.Counters()}
	}
	for id, tg := range targets {
		s.Pause(id, true)
		s.Add(id, tg, false)
	}
	for id := range targets {
		s.Pause(id, false)
	}
	// 1100 bytes ≥ 1000: the largest goes first, then 400 < 1000 stops the trigger.
	eventually(t, "the largest shard sealed", func() bool { return s.Stats().Seals == 1 })
	time.Sleep(50 * time.Millisecond)
	if st := s.Stats(); st.Seals != 1 || order[0] != "large" {
		t.Fatalf("sealed %v (%+v), want only the largest", order, st)
	}
}

func TestNoMoreThanConcurrencySealsRunAtOnce(t *testing.T) {
	var running, peak atomic.Int32
	s := newScheduler(t, seal.Options{SizeBytes: 1, Concurrency: 2, Interval: time.Millisecond})
	for i := range 6 {
		s.Add(string(rune('a'+i)), &target{bytes: 10, hold: 30 * time.Millisecond, running: &running, peak: &peak, counters: s.Counters()}, false)
	}
	eventually(t, "six seals", func() bool { return s.Stats().Seals == 6 })
	if p := peak.Load(); p > 2 || p < 1 {
		t.Fatalf("%d seals ran at once, want at most 2", p)
	}
}

func TestAFailingShardBacksOffWithoutAHotLoop(t *testing.T) {
	s := newScheduler(t, seal.Options{SizeBytes: 1, Interval: time.Millisecond, BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	tg := &target{bytes: 10, err: errors.New("store down"), counters: s.Counters()}
	s.Add("s", tg, false)
	time.Sleep(time.Second)
	// Attempts at 0, 50, 150, 350, 550, 750, 950 ms: 7, give or take scheduling.
	// The bound that matters is the upper one: no hot loop. A loaded machine may
	// make fewer attempts.
	if n := tg.attempts.Load(); n < 2 || n > 9 {
		t.Fatalf("%d attempts in a second, want about 7: backoff 50 ms doubling to 200 ms", n)
	}
	if st := s.Stats(); st.Failures != uint64(tg.attempts.Load()) && st.Failures+1 != uint64(tg.attempts.Load()) {
		t.Fatalf("%+v for %d attempts", st, tg.attempts.Load())
	}
}

func TestAStoppedShardIsNotRetried(t *testing.T) {
	tg := &target{bytes: 10, err: ErrStopped}
	s := newScheduler(t, seal.Options{SizeBytes: 1, Interval: time.Millisecond, BackoffMin: time.Millisecond})
	s.Add("s", tg, true)
	time.Sleep(100 * time.Millisecond)
	if n := tg.attempts.Load(); n != 1 {
		t.Fatalf("%d attempts of a stopped shard, want 1", n)
	}
}

func TestRemoveCancelsAndWaitsForTheSealInFlight(t *testing.T) {
	tg := &target{bytes: 10, hold: time.Hour}
	s := newScheduler(t, seal.Options{SizeBytes: 1, Interval: time.Millisecond})
	s.Add("s", tg, false)
	eventually(t, "the seal started", func() bool { return tg.attempts.Load() == 1 })
	done := make(chan struct{})
	go func() { s.Remove("s", true); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Remove did not return: the seal in flight was not cancelled")
	}
}
