// Package shardlink is how an engine opens its shards: what it gives each (Config),
// and the constructor package shard registers as it initialises (Open), so that
// only the engine, and no user of package shard, can open one.
package shardlink

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/internal/sealer"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/wal"
)

// Open opens shard id with cfg and returns its *shard.Shard. Package shard sets
// it when it initialises; the engine imports shard, so it is set before any
// engine runs.
var Open func(id string, cfg Config, armed bool) (any, error)

// Config is what the engine gives a shard. Every field is required unless said.
type Config struct {
	Log   *wal.Log
	Owner *ownership.Owner
	// Replicas are where parts go: a seal writes to the first, reads try each.
	Replicas *replication.Set
	Sealer   *sealer.Scheduler
	// Uploader copies the parts the shard's seals commit to the other replicas,
	// each recorded by Owner; Close waits for those copies before it releases the
	// lease.
	Uploader *replication.Uploader
	// UploadWait bounds how long Close (and Retire, for a part it settled) waits
	// for those copies before it releases anyway: the parts are durable on the
	// first replica, and a copy that outlives the wait stays unrecorded until a
	// backfill. Zero means no bound but the context's.
	UploadWait time.Duration
	// PartsDir holds part files while they are written, on FS.
	PartsDir      string
	FS            vfs.FS
	BlockSize     int           // part block size; 0 means the default
	Encoder       *zstd.Encoder // shared by the engine's seals
	SizeTrigger   uint64        // unsealed bytes at which an append asks for a seal
	MaxRecordSize int
	MaxBatchBytes int
	Clock         clock.Clock
	// Events hear what the shard did; both are required.
	Events Events
	// Tail, if set, is where the shard's pages are shipped (see sealer.Tail, and
	// ReleaseLeaving for Until).
	Tail Tail
}

// Events are the callbacks a shard reports to. Each runs on the goroutine of
// what it reports and must not block it.
type Events struct {
	// AppendEnded is told of every call to Append: its records and bytes, how
	// long it took, and its error (nil once the records are durable). It runs on
	// the append path: it must be cheap and safe for concurrent use.
	AppendEnded func(records, bytes int, took time.Duration, err error)
	// ShardClosed is told once, when the shard has closed or retired, of the
	// parts whose commit had an unknown outcome that it could not settle: each
	// may be in the manifest without its copies, until a backfill.
	ShardClosed func(shard string, inDoubt []manifest.Part)
}

// Tail is what a shard asks of the tail its pages are shipped to.
type Tail interface {
	sealer.Tail
	// Until waits until every page of the shard given to the tail is shipped,
	// and returns a position past every object that holds one; ok is false if
	// the shard gave the tail nothing.
	Until(ctx context.Context, shard string) (incarnation, sequence uint64, ok bool, err error)
}

// ReleaseLeaving gives o's lease on shard id back without sealing. With pages in
// the log, it first waits for them to be shipped in tail, and records that there
// is a backlog and where it ends in the tail, for the next owner; if they cannot
// be shipped the lease is kept (it runs out, and the next owner fences the tail).
func ReleaseLeaving(ctx context.Context, log *wal.Log, tail Tail, o *ownership.Owner, id string) error {
	if log.Info(id).Pages == 0 {
		return o.Release(ctx)
	}
	var inc, until uint64
	if tail != nil {
		var err error
		if inc, until, _, err = tail.Until(ctx, id); err != nil {
			return fmt.Errorf("the tail was not shipped, so the lease is kept: %w", err)
		}
	}
	return o.ReleaseWithBacklog(ctx, inc, until)
}

// ReadOptions are what the shard.ReadOption values of a read set, for a reader
// other than a Shard's (engine.Reader), which takes the same options.
type ReadOptions struct {
	Follow  bool
	Bounded bool // by Until
	Until   uint64
	Limit   int // 0: no bound
}

// ReadOptionsOf returns the ReadOptions that opts, a []shard.ReadOption, set.
// Package shard sets it when it initialises, as it does Open, so that the
// options' fields stay its own.
var ReadOptionsOf func(opts any) ReadOptions
