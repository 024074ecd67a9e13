// Package testclock is a settable clock for tests of leases, ages and lags.
package testclock

import (
	"sync/atomic"
	"time"
)

// Clock reads a time that moves only when told to. It is safe for concurrent use.
type Clock struct{ ns atomic.Int64 }

// New returns a clock set to a fixed instant.
func New() *Clock {
	c := &Clock{}
	c.ns.Store(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).UnixNano())
	return c
}

// Now is the clock's time; pass it where an Options.Now is taken.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
