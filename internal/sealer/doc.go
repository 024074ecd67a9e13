// Package sealer is the machinery behind package seal's options: the scheduler
// that decides when each of an engine's shards seals, and the job that performs
// one seal.
//
// A Scheduler evaluates the triggers of every shard it holds (size, WAL bytes, age
// of the oldest unsealed record, and the deferred flag) and runs their seals in the
// background, at most seal.Options.Concurrency at a time and one per shard. The
// flag is cleared before a seal runs; a seal cut short by its budget, or one that
// failed for any reason but a stopped shard (ErrStopped), re-arms it, and a failure
// backs the shard off. An open that inherits unsealed pages adds its shard armed,
// so they seal at once.
//
// A Job is one seal: encode the pages into a part file, put it under a new key,
// commit it to the manifest by compare-and-swap, truncate the WAL through the
// sealed page. It returns what it committed, each part with its local file, and the
// caller queues the copies. A part whose commit had an unknown outcome waits in the
// shard's Doubts until its next seal settles it. Counters count every seal, whoever
// runs it. DESIGN.md ("Sealing") gives what a crash between any two steps leaves
// and how the next seal or open repairs it.
//
// Usage (the engine and its shards do this):
//
//	s, err := sealer.NewScheduler(opts.Seal)
//	s.Add("orders-7", sh, inherited) // sh, a *shard.Shard, implements Target
//	st := s.Stats()                  // seals, empty seals, failures, ...
//	s.Close()
package sealer
