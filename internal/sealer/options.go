package sealer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/seal"
)

// EnsureDefaults fills in the zero fields of o with the defaults its fields
// document.
func EnsureDefaults(o *seal.Options) {
	if o.SizeBytes == 0 {
		o.SizeBytes = 8 << 20
	}
	if o.WALBytes == 0 {
		o.WALBytes = 256 << 20
	}
	if o.Age == 0 {
		o.Age = 45 * time.Second
	}
	if o.Budget == 0 {
		o.Budget = 64 << 20
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.BackoffMin == 0 {
		o.BackoffMin = 500 * time.Millisecond
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 30 * time.Second
	}
	if o.Concurrency == 0 {
		o.Concurrency = 2
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports invalid defaulted options.
func Validate(o *seal.Options) error {
	switch {
	case o.Age < 0 || o.Interval < 0 || o.BackoffMin < 0:
		return fmt.Errorf("seal: negative duration")
	case o.BackoffMax < o.BackoffMin:
		return fmt.Errorf("seal: BackoffMax %s below BackoffMin %s", o.BackoffMax, o.BackoffMin)
	case o.Concurrency < 0:
		return fmt.Errorf("seal: Concurrency %d", o.Concurrency)
	}
	return nil
}
