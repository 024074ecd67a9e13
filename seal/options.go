package seal

import (
	"log/slog"
	"time"

	"github.com/l0store/l0/clock"
)

// Options configure sealing. The zero value of each field means its default.
type Options struct {
	// SizeBytes seals a shard whose unsealed records reach this many bytes.
	// Default 8 MiB.
	SizeBytes uint64
	// WALBytes seals the shards with the most unsealed bytes, largest first, while
	// all shards together hold at least this many. Default 256 MiB.
	WALBytes uint64
	// Age seals a shard whose oldest unsealed record is this old, measured by Now
	// from when it was appended. Default 45 s.
	Age time.Duration
	// Budget caps the record bytes of one seal (at least one page is sealed); a seal
	// cut short by it re-arms the shard's deferred flag, so the rest follows at the
	// next evaluation. Default 64 MiB.
	Budget uint64
	// Interval is how often every shard's triggers are evaluated even when nothing
	// happens, so an idle shard still ages into a seal. Default 1 s.
	Interval time.Duration
	// BackoffMin and BackoffMax bound the wait after a failed seal of a shard before
	// its next attempt; the wait doubles with each failure in a row. Defaults
	// 500 ms and 30 s.
	BackoffMin, BackoffMax time.Duration
	// Concurrency is how many seals run at once. Default 2.
	Concurrency int
	// Logger receives the failures of background seals, each retried after its
	// backoff; nil discards them.
	Logger *slog.Logger
	// Clock is the clock of the age trigger, the interval and the backoff.
	// Default clock.Real.
	Clock clock.Clock
}
