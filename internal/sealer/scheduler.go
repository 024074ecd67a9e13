package sealer

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/l0store/l0/seal"
)

var (
	// ErrStopped marks a seal that failed because its shard was closed, retired
	// or fenced: the scheduler does not retry it.
	ErrStopped = errors.New("seal: shard stopped")
	// ErrLogChanged marks a seal whose pages, when read, were not those it had
	// named its part for: a reset of the shard's log came between. The next seal
	// looks again.
	ErrLogChanged = errors.New("seal: the log changed under the seal")
)

// Target is a shard as the scheduler sees it.
type Target interface {
	// Unsealed reports the bytes of the shard's unsealed records and when the oldest
	// of them was appended (zero without any).
	Unsealed() (bytes uint64, oldest time.Time)
	// Seal seals the oldest unsealed records, up to budget bytes but at least one
	// page.
	Seal(ctx context.Context, budget uint64) (seal.Result, error)
}

// Stats are the scheduler's counters.
type Stats struct {
	Seals       uint64 // seals that sealed something
	EmptySeals  uint64 // seals that ran and found nothing
	Failures    uint64 // seals that failed
	Objects     uint64 // objects written by seals
	SealedBytes uint64 // record bytes sealed
}

// Scheduler evaluates the triggers of every shard it holds and runs their seals,
// at most Concurrency at a time and one per shard.
type Scheduler struct {
	opts seal.Options
	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	sem  chan struct{}
	wg   sync.WaitGroup // seals running

	counters Counters
	mu       struct {
		sync.Mutex
		shards map[string]*entry
		paused map[string]bool
	}
}

// entry is one shard's sealing state.
type entry struct {
	t        Target
	deferred bool // seal at the next evaluation, whatever the triggers say
	running  bool // a seal is in flight
	stopped  bool // a seal reported ErrStopped: never again
	waiting  bool // backing off after a failure, until its timer clears it
	backoff  time.Duration
	cancel   context.CancelFunc // of the seal in flight
	idle     chan struct{}      // closed when the seal in flight ends
}

// NewScheduler starts a scheduler.
func NewScheduler(opts seal.Options) (*Scheduler, error) {
	EnsureDefaults(&opts)
	if err := Validate(&opts); err != nil {
		return nil, err
	}
	s := &Scheduler{
		opts: opts,
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
		sem:  make(chan struct{}, opts.Concurrency),
	}
	s.mu.shards = make(map[string]*entry)
	s.mu.paused = make(map[string]bool)
	go s.loop()
	return s, nil
}

// Add starts evaluating shard id. With armed, its deferred flag is set, so it seals
// at the first evaluation, which happens at once: an open that inherits unsealed
// pages passes armed.
func (s *Scheduler) Add(id string, t Target, armed bool) {
	s.mu.Lock()
	s.mu.shards[id] = &entry{t: t, deferred: armed}
	s.mu.Unlock()
	s.Kick()
}

// Remove stops evaluating shard id, cancels its seal in flight and, with wait,
// waits for that seal to end.
func (s *Scheduler) Remove(id string, wait bool) {
	s.mu.Lock()
	e, ok := s.mu.shards[id]
	delete(s.mu.shards, id)
	var idle chan struct{}
	if ok && e.running {
		e.cancel()
		idle = e.idle
	}
	s.mu.Unlock()
	if wait && idle != nil {
		<-idle
	}
}

// Pause stops or resumes starting seals of shard id, whether or not it was added
// yet; a seal in flight finishes. For maintenance, and for tests that need a shard's
// backlog to stay put.
func (s *Scheduler) Pause(id string, paused bool) {
	s.mu.Lock()
	if paused {
		s.mu.paused[id] = true
	} else {
		delete(s.mu.paused, id)
	}
	s.mu.Unlock()
	s.Kick()
}

// Kick asks for an evaluation now, for instance after an append that may have
// crossed the size trigger.
func (s *Scheduler) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Counters returns the counters of the engine's seals: a Target's Seal observes
// its outcome there (the scheduler counts nothing itself, so that a seal run by a
// shard's Close or called directly counts too).
func (s *Scheduler) Counters() *Counters { return &s.counters }

// Stats returns the counters' counts.
func (s *Scheduler) Stats() Stats { return s.counters.Stats() }

// Close stops the scheduler, cancels the seals in flight and waits for them.
func (s *Scheduler) Close() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	for _, e := range s.mu.shards {
		if e.running {
			e.cancel()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Scheduler) loop() {
	defer close(s.done)
	for {
		s.evaluate()
		select {
		case <-s.stop:
			return
		case <-s.opts.Clock.After(s.opts.Interval):
		case <-s.kick:
		}
	}
}

// evaluate starts the seals that are due.
func (s *Scheduler) evaluate() {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	type candidate struct {
		id    string
		e     *entry
		bytes uint64
	}
	var all []candidate
	var total uint64
	for id, e := range s.mu.shards {
		bytes, oldest := e.t.Unsealed()
		total += bytes
		all = append(all, candidate{id, e, bytes})
		if e.stopped || e.running || s.mu.paused[id] || e.waiting {
			continue
		}
		deferred := e.deferred
		size := bytes >= s.opts.SizeBytes
		age := bytes > 0 && !oldest.IsZero() && now.Sub(oldest) >= s.opts.Age
		if deferred || size || age {
			s.startLocked(id, e, bytes)
		}
	}
	// The WAL trigger: the largest shards until the rest is under the threshold.
	slices.SortFunc(all, func(a, b candidate) int { return cmp.Compare(b.bytes, a.bytes) })
	for _, c := range all {
		if total < s.opts.WALBytes {
			break
		}
		total -= c.bytes
		if !c.e.stopped && !c.e.running && !s.mu.paused[c.id] && !c.e.waiting && c.bytes > 0 {
			s.startLocked(c.id, c.e, c.bytes)
		}
	}
}

// startLocked runs a seal of e if a slot is free; otherwise the next evaluation
// tries again.
func (s *Scheduler) startLocked(id string, e *entry, bytes uint64) {
	select {
	case s.sem <- struct{}{}:
	default:
		return
	}
	// The flag is cleared before the seal runs: a cut or a failure arms
	// it again.
	e.deferred = false
	if bytes == 0 {
		<-s.sem
		return // an empty shard never seals
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.running, e.cancel, e.idle = true, cancel, make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		res, err := e.t.Seal(ctx, s.opts.Budget)
		cancel()
		<-s.sem
		s.finished(id, e, res, err)
	}()
}

func (s *Scheduler) finished(id string, e *entry, res seal.Result, err error) {
	s.mu.Lock()
	defer func() {
		e.running = false
		close(e.idle)
		s.mu.Unlock()
		s.Kick()
	}()
	if err != nil {
		if errors.Is(err, ErrStopped) {
			e.stopped = true // its owner is gone: evaluating it again would loop
			return
		}
		// Any trigger's failure re-arms the flag: the backlog's age may
		// have restarted at an open, and the retry must not wait for it.
		e.deferred = true
		e.backoff = min(max(2*e.backoff, s.opts.BackoffMin), s.opts.BackoffMax)
		s.opts.Logger.Warn("seal: failed, retrying", "shard", id, "backoff", e.backoff, "err", err)
		e.waiting = true
		s.opts.Clock.AfterFunc(e.backoff, func() {
			s.mu.Lock()
			e.waiting = false
			s.mu.Unlock()
			s.Kick()
		})
		return
	}
	e.backoff = 0
	if res.Cut {
		e.deferred = true // the rest seals at the next evaluation
	}
}
