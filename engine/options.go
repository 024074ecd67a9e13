package engine

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/internal/sealer"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate"
)

// Limits on Options. A batch is one WAL page, copied whole into the WAL's filling
// group: keeping it well under the group's bound keeps appends sharing fdatasyncs.
const (
	DefaultMaxRecordSize = 1 << 20
	DefaultMaxBatchBytes = 4 << 20
	MaxBatchBytesLimit   = 64 << 20
)

// Options configure an Engine. The zero value of every field but Dir is valid and
// means the default that the field documents.
type Options struct {
	// Dir holds the engine's local state: the WAL in Dir/wal. Required. One engine
	// at a time may use a Dir; a second Open fails while the first is open.
	Dir string
	// Registerer receives the engine's l0_ metrics; nil registers nothing (Metrics
	// still works). The collectors are unregistered at Close, so engines opened one
	// after another may share a Registerer; engines open at the same time need
	// their own, or one wrapped with prometheus.WrapRegistererWith.
	Registerer prometheus.Registerer
	// Logger receives the engine's and the WAL's messages; nil discards them. Nothing
	// is logged on the append path.
	Logger *slog.Logger
	// MaxRecordSize is the largest record Append accepts, in bytes. Default 1 MiB.
	MaxRecordSize int
	// MaxBatchBytes is the largest sum of record sizes one Append accepts. Default
	// 4 MiB, at most 64 MiB, and at least MaxRecordSize.
	MaxBatchBytes int
	// Replicas are where sealed parts and manifests go, in order: a seal writes each
	// part to the first, and the uploader copies it to the others. Attaching a
	// replica is opening with a longer list; BackfillUnderReplicated then copies the
	// history. Required, unless Bucket is set. The engine does not close the buckets.
	Replicas []replica.Spec
	// Authority names the replica whose manifest copy fences owners: every lease is
	// a compare-and-swap there. Default: the first replica. In a fleet it must be a
	// replica every instance shares.
	Authority string
	// Bucket is shorthand for a single replica named after the bucket, in the
	// domain "default". Set Replicas or Bucket, not both.
	Bucket *substrate.Bucket
	// BackfillOnOpen copies, at each OpenShard, the shard's parts that some replica
	// lacks. Default off: it is real egress on existing data. When off and parts are
	// under-replicated, the engine logs once that the other replicas are not a
	// recoverable copy.
	BackfillOnOpen bool
	// Upload configures the uploader: workers, attempts, backoff. Its TempDir
	// defaults to Dir/uploads, on FS; the uploader's clock is Clock. Its ObserveLag,
	// if set, is called besides the engine's l0_upload_lag_seconds histogram.
	Upload replica.Options
	// Instance names this engine in the leases it holds and in its tail's keys.
	// Default: an id created at the first Open of Dir and kept in Dir/instance, so
	// a restarted engine takes its own shards back at once. Two engines open at
	// once must not share one: each would fence the other's tail.
	Instance string
	// Seal configures the seal triggers, budget, backoff and concurrency.
	Seal seal.Options
	// Lease configures the instance lease every shard is owned under (its clock
	// is Clock; an OpenShard that waits for another's lease: WaitForLease).
	Lease LeaseOptions
	// RenewEvery is how often the engine's instance lease, which every shard it
	// owns is owned under, is renewed: one conditional write per interval, 1.3
	// million a month at 2 s (about 6.50 USD at GCS's or S3's list price for
	// class A operations), 260 thousand at 10 s (1.30 USD). Default a third of
	// Lease.Duration (2 s); it must be under Lease.Duration minus twice its skew
	// margin.
	RenewEvery time.Duration
	// BlockSize is the raw size of a part's blocks. Default 64 KiB.
	BlockSize int
	// Clock is the engine's time: of pages, seal ages, leases, and of every
	// interval, retry and backoff of its background work. Default clock.Real.
	Clock clock.Clock
	// FS is the file system of everything the engine keeps in Dir: the WAL, part
	// files while they are sealed and copied, the instance id and incarnation.
	// Default vfs.Default. A test passes an in-memory one that forgets what was not
	// synced (a power loss), or one that fails the i-th call.
	FS vfs.FS
	// Durability says when an append is acknowledged: Remote (the default) once it
	// is on the tail replica as well as on the local disk, Local once it is on the
	// local disk. See Durability.
	Durability Durability
	// Tail configures the remote tail: where it goes, how often it flushes, and
	// the bounds of Local mode's unshipped window.
	Tail TailOptions
}

// Durability is when an append is acknowledged.
type Durability int

const (
	// Remote acknowledges an append once the tail object holding it, and every one
	// before it, is durable on the tail replica (and the WAL synced): a nil error
	// means the record survives the loss of the machine. An append waits for the
	// next flush: on average half the flush interval plus one put.
	Remote Durability = iota
	// Local acknowledges an append once the WAL synced it; the tail follows within
	// the flush interval. A machine lost for good loses what was not shipped yet:
	// at most TailOptions' unshipped window, which the l0_tail_unshipped gauges
	// report.
	Local
)

func (d Durability) String() string {
	switch d {
	case Remote:
		return "remote"
	case Local:
		return "local"
	}
	return fmt.Sprintf("Durability(%d)", int(d))
}

// TailOptions configure the remote tail: one engine-wide flusher that ships every
// page the WAL takes, for all shards at once, as one object per flush, so that the
// next owner of a shard on any machine reads what this one did not seal.
type TailOptions struct {
	// Replica names the replica the tail objects go to. Default: the authority.
	// Every engine that may take over this one's shards must have it too.
	Replica string
	// Interval is the least time between the starts of two flushes while pages
	// keep coming (an idle engine ships nothing). Default 50 ms.
	Interval time.Duration
	// Bytes starts a flush at once when this many record bytes are pending.
	// Default 4 MiB.
	Bytes int
	// Retry is the wait before a tail put that failed is put again (appends wait
	// meanwhile). Default 100 ms.
	Retry time.Duration
	// MaxUnshippedBytes and MaxUnshippedAge bound Local mode's window of records
	// acknowledged and not yet shipped: an append waits while the window holds
	// that many bytes, or its oldest page is that old. Defaults 64 MiB and 1 s.
	MaxUnshippedBytes int
	MaxUnshippedAge   time.Duration
	// CollectEvery is how often the engine deletes its tail objects that no shard
	// needs any more (every section sealed or superseded); CollectAfter is the
	// least age of an object it deletes, seen from its first listing, so that a
	// takeover reading the tail is not cut short. Defaults 1 min and 5 min.
	CollectEvery time.Duration
	CollectAfter time.Duration
}

func (o *TailOptions) ensureDefaults() {
	if o.Interval == 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Bytes == 0 {
		o.Bytes = 4 << 20
	}
	if o.MaxUnshippedBytes == 0 {
		o.MaxUnshippedBytes = 64 << 20
	}
	if o.MaxUnshippedAge == 0 {
		o.MaxUnshippedAge = time.Second
	}
	if o.CollectEvery == 0 {
		o.CollectEvery = time.Minute
	}
	if o.CollectAfter == 0 {
		o.CollectAfter = 5 * time.Minute
	}
}

// EnsureDefaults fills in the zero fields.
func (o *Options) EnsureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxRecordSize == 0 {
		o.MaxRecordSize = DefaultMaxRecordSize
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = max(DefaultMaxBatchBytes, o.MaxRecordSize)
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.FS == nil {
		o.FS = vfs.Default
	}
	o.Seal.Clock = o.Clock
	if o.Seal.Logger == nil {
		o.Seal.Logger = o.Logger
	}
	if len(o.Replicas) == 0 && o.Bucket != nil {
		o.Replicas = []replica.Spec{{Name: o.Bucket.Name(), Domain: "default", Bucket: o.Bucket}}
	}
	sealer.EnsureDefaults(&o.Seal)
	own := o.ownership()
	own.EnsureDefaults()
	o.Lease = LeaseOptions{Duration: own.Duration, SkewMargin: own.SkewMargin}
	if o.RenewEvery == 0 {
		o.RenewEvery = o.Lease.Duration / 3
	}
	o.Tail.ensureDefaults()
}

// Validate reports the first invalid field of defaulted options as an error wrapping
// ErrInvalidOptions.
func (o *Options) Validate() error {
	_, err := o.validate()
	return err
}

// validate is Validate, returning the replica set the options declare.
func (o *Options) validate() (*replication.Set, error) {
	switch {
	case o.Dir == "":
		return nil, fmt.Errorf("%w: Dir is required", ErrInvalidOptions)
	case o.MaxRecordSize <= 0:
		return nil, fmt.Errorf("%w: MaxRecordSize %d", ErrInvalidOptions, o.MaxRecordSize)
	case o.MaxBatchBytes <= 0 || o.MaxBatchBytes > MaxBatchBytesLimit:
		return nil, fmt.Errorf("%w: MaxBatchBytes %d, want 1 to %d", ErrInvalidOptions, o.MaxBatchBytes, MaxBatchBytesLimit)
	case o.MaxRecordSize > o.MaxBatchBytes:
		return nil, fmt.Errorf("%w: MaxRecordSize %d over MaxBatchBytes %d", ErrInvalidOptions, o.MaxRecordSize, o.MaxBatchBytes)
	case len(o.Replicas) == 0:
		return nil, fmt.Errorf("%w: Replicas (or Bucket) is required", ErrInvalidOptions)
	case o.Bucket != nil && (len(o.Replicas) != 1 || o.Replicas[0].Bucket != o.Bucket):
		return nil, fmt.Errorf("%w: set Replicas or Bucket, not both", ErrInvalidOptions)
	case o.RenewEvery <= 0 || o.RenewEvery >= o.Lease.Duration-2*o.Lease.SkewMargin:
		return nil, fmt.Errorf("%w: RenewEvery %s with a lease of %s and a skew margin of %s", ErrInvalidOptions, o.RenewEvery, o.Lease.Duration, o.Lease.SkewMargin)
	case o.Durability != Remote && o.Durability != Local:
		return nil, fmt.Errorf("%w: Durability %d", ErrInvalidOptions, o.Durability)
	case o.Tail.Interval < 0 || o.Tail.Bytes < 0 || o.Tail.MaxUnshippedBytes < 0 || o.Tail.MaxUnshippedAge < 0 ||
		o.Tail.CollectEvery < 0 || o.Tail.CollectAfter < 0 || o.Tail.Retry < 0:
		return nil, fmt.Errorf("%w: Tail %+v", ErrInvalidOptions, o.Tail)
	}
	if err := sealer.Validate(&o.Seal); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if own := o.ownership(); own.Validate() != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, own.Validate())
	}
	set, err := replication.NewSet(o.Replicas, o.Authority)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if _, ok := set.Get(o.Tail.Replica); o.Tail.Replica != "" && !ok {
		return nil, fmt.Errorf("%w: Tail.Replica %q is not one of Replicas", ErrInvalidOptions, o.Tail.Replica)
	}
	return set, nil
}

// LeaseOptions configure the instance lease an engine's shards are owned under.
type LeaseOptions struct {
	// Duration is how long the lease lasts after it was taken or last renewed
	// (default 6 s). A machine that dies holds its shards this long, plus the skew
	// margin, before another may take them over: the bound of a failover. A
	// longer lease rides out longer stalls of the object store, and, renewed a
	// third as often by default, costs fewer writes.
	Duration time.Duration
	// SkewMargin is how much two instances' clocks may disagree (default 1 s):
	// the owner stops acknowledging SkewMargin before its lease's expiry by its
	// own clock, and another instance takes an unreleased lease over only
	// SkewMargin after it by its own.
	SkewMargin time.Duration
}

// ownership is the manifest's lease options the engine's ownerships run under.
func (o Options) ownership() ownership.LeaseOptions {
	return ownership.LeaseOptions{Duration: o.Lease.Duration, SkewMargin: o.Lease.SkewMargin, Clock: o.Clock}
}
