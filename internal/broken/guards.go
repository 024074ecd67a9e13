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
)

// Guards lists them all.
var Guards = []Guard{AckBeforeSync, SkipFence, CollectNeeded, ReuseOffset}
