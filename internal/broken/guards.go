package broken

// Guard names a guard of the engine that a broken build switches off.
type Guard string

// The guards, each the one a promise rests on.
const (
	// AckBeforeSync acknowledges an append before the WAL synced it.
	AckBeforeSync Guard = "ack-before-sync"
	// SkipFence takes a shard over without fencing its previous owner's tail.
	SkipFence Guard = "skip-fence"
	// CollectNeeded deletes tail objects whatever a shard still needs of them.
	CollectNeeded Guard = "collect-needed"
	// ReuseOffset gives every fifth page of a shard the offset of the record
	// before it.
	ReuseOffset Guard = "reuse-offset"
	// UnlistedIncarnation starts a fenced tail's next incarnation without
	// writing it into the chain: its pages are acknowledged where no reader
	// follows.
	UnlistedIncarnation Guard = "unlisted-incarnation"
	// OneIncarnation reads a shard's history in its pointer's incarnation alone,
	// not through the chain.
	OneIncarnation Guard = "one-incarnation"
	// StaleClaim has a fleet member keep, and claim, a fenced handle of a shard
	// assigned to it: the leader keeps the shard there, where nobody serves it.
	StaleClaim Guard = "stale-claim"
)

// Guards lists them all.
var Guards = []Guard{AckBeforeSync, SkipFence, CollectNeeded, ReuseOffset, UnlistedIncarnation, OneIncarnation, StaleClaim}
