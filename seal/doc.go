// Package seal configures how an engine seals its shards' records into parts on
// the object store (engine.Options.Seal), and says what one seal did (Result).
//
// A shard seals when one of its triggers fires: its unsealed records reach
// Options.SizeBytes, the oldest of them is Options.Age old, or all the engine's
// shards together hold Options.WALBytes unsealed, and then the largest seal until
// the rest hold less. The triggers are evaluated every Options.Interval, and at once after an
// append that may have crossed the size trigger. At most Options.Concurrency seals
// run at once, one per shard, each of at most Options.Budget record bytes: a seal
// cut short by its budget goes on at the next evaluation, and a failed one is
// retried after a backoff that doubles from Options.BackoffMin to
// Options.BackoffMax. An open that inherits unsealed records seals them at once.
//
// A seal encodes the shard's oldest unsealed pages into a part, puts it on the
// first replica, commits it to the shard's manifest and truncates the WAL through
// it; shard.Shard.Seal runs one directly and returns its Result. DESIGN.md
// ("Sealing") gives what a crash between any two steps leaves and how the next seal
// or open repairs it.
//
// Usage:
//
//	opts := engine.Options{Dir: dir, Bucket: bucket, Seal: seal.Options{Age: 10 * time.Second}}
//	res, err := sh.Seal(ctx, 64<<20) // sh is a *shard.Shard; seal now, whatever the triggers
package seal
