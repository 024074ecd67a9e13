// Package testclock is a settable clock for tests and simulations of leases, ages
// and lags.
package testclock

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock is a clock.Clock whose time moves only when told to. Its timers fire when
// the time is advanced past them, and at the latest once their duration has passed
// in real time: the engine's background work (flushes, renewals, retries) keeps
// its pace while a test holds the time still, and a jump runs what it made due at
// once. It is safe for concurrent use.
type Clock struct {
	ns     atomic.Int64
	mu     sync.Mutex
	timers map[*timer]struct{} // pending
}

type timer struct {
	at    int64 // the clock's time it is due at, in ns
	fired atomic.Bool
	real  *time.Timer
	fn    func()
}

// New returns a clock set to a fixed instant.
func New() *Clock { return NewAt(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)) }

// NewAt returns a clock set to at.
func NewAt(at time.Time) *Clock {
	c := &Clock{timers: make(map[*timer]struct{})}
	c.ns.Store(at.UnixNano())
	return c
}

// Now is the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Advance moves the clock forward by d and fires the timers it made due.
func (c *Clock) Advance(d time.Duration) {
	now := c.ns.Add(int64(d))
	c.mu.Lock()
	var due []*timer
	for t := range c.timers {
		if t.at <= now {
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		c.fire(t)
	}
}

// Skip moves the clock forward by d without firing the timers it made due: they
// fire at their real time, as when the engine's background work falls behind
// (a renewal that has not run yet when a lease runs out).
func (c *Clock) Skip(d time.Duration) { c.ns.Add(int64(d)) }

// After returns a channel that receives the clock's time once d has passed.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.schedule(d, func() { ch <- c.Now() })
	return ch
}

// AfterFunc calls f in its own goroutine once d has passed.
func (c *Clock) AfterFunc(d time.Duration, f func()) func() bool {
	t := c.schedule(d, func() { go f() })
	return func() bool {
		if !c.take(t) {
			return false
		}
		t.real.Stop()
		return true
	}
}

func (c *Clock) schedule(d time.Duration, fn func()) *timer {
	t := &timer{at: c.ns.Load() + int64(d), fn: fn}
	c.mu.Lock()
	c.timers[t] = struct{}{}
	c.mu.Unlock()
	t.real = time.AfterFunc(max(d, 0), func() { c.fire(t) })
	return t
}

func (c *Clock) fire(t *timer) {
	if c.take(t) {
		t.fn()
	}
}

// take removes t from the pending timers, once: it reports whether this call did,
// so that a timer fires, or is stopped, exactly once.
func (c *Clock) take(t *timer) bool {
	if !t.fired.CompareAndSwap(false, true) {
		return false
	}
	c.mu.Lock()
	delete(c.timers, t)
	c.mu.Unlock()
	return true
}
