// Package replica is what a user declares and reads of an engine's replicas: the
// replicas themselves (Spec, in engine.Options.Replicas), how sealed parts are
// copied among them (Options, engine.Options.Upload), and what the set promises and
// the parts say about the data (Config and Durability, in the engine's metrics and
// its Assess).
//
// The first replica receives a part at seal; the engine's uploader copies it to the
// others in the background and records each copy in the shard's manifest. A part
// sealed before a replica was attached, or before a restart, is copied only by a
// backfill.
package replica

import (
	"time"

	"github.com/l0store/l0/substrate"
)

// Spec is one replica.
type Spec struct {
	// Name identifies the replica in manifests; unique in the set, and a valid key
	// segment.
	Name string
	// Domain is the replica's failure domain: replicas in one domain can be lost
	// together (one node, one zone, one provider region).
	Domain string
	Bucket *substrate.Bucket
}

// Config is what the declared replica set promises: configuration, not data. Whether
// the parts are actually spread is Durability's to say.
type Config struct {
	Size            int
	DistinctDomains int
	// SinglePointOfFailure: one domain holds every replica.
	SinglePointOfFailure bool
}

// Durability is what the parts say about the data.
type Durability struct {
	Parts int
	// UnderReplicated parts lack a copy on some replica of the set.
	UnderReplicated int
	// Stuck are under-replicated parts with no upload queued: nothing will improve
	// them until a backfill.
	Stuck int
	// SurvivesDomainLoss is claimed from evidence only: at least one part is known
	// and every part has copies in at least two failure domains. With no part known
	// it is false (read it beside Parts), and so it is for a set of one domain, even
	// with every part on every replica: losing that domain loses them all.
	SurvivesDomainLoss bool
}

// Options configure how an engine copies sealed parts to the replicas that lack
// them. The zero value of each field means its default.
type Options struct {
	Workers    int           // concurrent copies; default 4
	Attempts   int           // per copy and per record, before the job fails; default 5
	BackoffMin time.Duration // default 100 ms, doubling
	BackoffMax time.Duration // default 5 s
	// TempDir holds parts read back from a replica while they are copied; the
	// engine's default is its Dir/uploads.
	TempDir string
	// ObserveLag, if set, receives the seal-to-durable lag of every part sealed in
	// this process once every replica holds it (for a histogram).
	ObserveLag func(time.Duration)
	// BackfillRecordDelay is the longest a backfill copy waits to be recorded while
	// more backfill copies of its shard are queued or running; they are then
	// recorded together, in one or two manifest publishes instead of one per few
	// copies, and the publishes do not contend with the copies. Default 1 s; a
	// negative value records each copy at once.
	BackfillRecordDelay time.Duration
	// AttemptTimeout bounds one attempt at reading a part's source, copying it to
	// a replica or recording the copy, so that a replica that never answers fails
	// the copy after its attempts instead of holding it, and the shard's Close that
	// waits for it, forever. Default 2 min.
	AttemptTimeout time.Duration
}
