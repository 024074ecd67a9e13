// Package clock is the time the engine reads and waits on. Every lease, age, pacing
// interval, retry and backoff in l0 goes through a Clock, so that a test or a
// simulation can hold the time still, jump past a lease's expiry, or run several
// machines whose clocks disagree.
package clock

import "time"

// Clock tells the time and waits on it. It must be safe for concurrent use.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// After returns a channel that receives the time once d has passed.
	After(d time.Duration) <-chan time.Time
	// AfterFunc calls f in its own goroutine once d has passed. stop cancels the
	// call and reports whether it did so before f started.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// Real is the operating system's clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// OrReal returns c, or Real if c is nil: the default of every Options.Clock.
func OrReal(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}
