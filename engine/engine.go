// Package engine is l0's entry point: the shards of one node over one shared WAL,
// their leases, seals and metrics.
//
// Open an engine on a directory and a bucket, open shards on it, append and read:
//
//	e, err := engine.Open(ctx, engine.Options{Dir: "/var/lib/l0", Bucket: bucket})
//	sh, err := e.OpenShard(ctx, "orders-7")  // takes the lease, seals inherited pages
//	first, err := sh.Append(ctx, rec1, rec2) // durable on return; offsets first, first+1
//	for rec, err := range sh.Read(ctx, 0) { ... } // sealed parts, then the WAL
//	err = sh.Close(ctx)                      // seal the tail, release the lease
//	err = e.Close()
//
// Appends to one shard are ordered; appends to different shards run in parallel and
// share the WAL's fsyncs. Seals run in the background by the triggers of
// Options.Seal.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"

	"github.com/l0store/l0/internal/event"
	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/internal/sealer"
	"github.com/l0store/l0/internal/shardlink"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

var (
	// ErrInvalidOptions reports Options that Validate refuses.
	ErrInvalidOptions = errors.New("engine: invalid options")
	// ErrClosed reports use of an Engine after Close.
	ErrClosed = errors.New("engine: closed")
	// ErrShardOpen reports an OpenShard of a shard that is already open.
	ErrShardOpen = errors.New("engine: shard already open")
	// ErrFenced is manifest.ErrFenced: an owner whose lease lapsed or was taken over.
	ErrFenced = manifest.ErrFenced
	// ErrOwned is manifest.ErrOwned: another instance holds the shard's lease.
	ErrOwned = manifest.ErrOwned
	// ErrManifestBehind reports a shard whose WAL knows a later owner epoch than its
	// manifest: the wrong bucket, or one that lost data.
	ErrManifestBehind = errors.New("engine: manifest behind the WAL")
	// ErrTailMissing reports a shard whose manifest points at tail records that are
	// not there: a section missing from the stream, or a stream on a replica this
	// engine does not have. The open refuses rather than hand out offsets another
	// owner may have acknowledged.
	ErrTailMissing = errors.New("engine: tail records missing")
	// ErrInstanceLost reports an engine whose instance lease another process wrote
	// over: an engine opened on the same Instance elsewhere. Every shard it owned
	// is fenced, for good.
	ErrInstanceLost = errors.New("engine: instance lease lost to another process")
)

// Engine is the shards of one node. It is safe for concurrent use.
type Engine struct {
	opts     Options
	log      *wal.Log
	set      *replication.Set
	store    *ownership.Store
	uploader *replication.Uploader
	sealer   *sealer.Scheduler
	encoder  *zstd.Encoder
	partsDir string
	metrics  *metrics
	events   event.Listener // what the shards, the uploader and the tail report (see newEvents)
	inst     instanceLease
	stop     chan struct{}
	// closing is cancelled when Close begins: takeovers in progress end.
	closing       context.Context
	cancelClosing context.CancelFunc
	done          chan struct{}

	mu struct {
		sync.Mutex
		closed  bool
		shards  map[string]*shard.Shard
		owners  map[string]*ownership.Owner
		opening map[string]bool
	}
	warnedUnderReplicated atomic.Bool

	// tail ships every page the WAL takes, to the replica named tailReplica
	// (see openTail).
	tail        *tail.Tail
	tailReplica string
}

// Open opens the engine in opts.Dir, creating the directory if needed, and recovers
// the WAL: every acknowledged record of every shard is there when Open returns.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	opts.EnsureDefaults()
	set, err := opts.validate()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	partsDir, walDir := filepath.Join(opts.Dir, "parts"), filepath.Join(opts.Dir, "wal")
	if opts.Upload.TempDir == "" {
		opts.Upload.TempDir = filepath.Join(opts.Dir, "uploads")
	}
	for _, d := range []string{partsDir, opts.Upload.TempDir, walDir} {
		if err := fsutil.MkdirAll(opts.FS, d); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	// The WAL's directory lock is taken first: only the engine that holds it may
	// create Dir/instance, or two opens of a new Dir could each write an id and the
	// loser's would outlive the winner's leases.
	log, err := wal.Open(walDir, wal.Options{Logger: opts.Logger, Clock: opts.Clock, FS: opts.FS})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if opts.Instance == "" {
		id, err := instanceID(opts.FS, opts.Dir)
		if err != nil {
			log.Close()
			return nil, err
		}
		opts.Instance = id
	}
	// Only this engine uses Dir now (the WAL holds its lock): part files there are
	// leftovers of seals a crash interrupted.
	if err := errors.Join(sealer.CleanDir(opts.FS, partsDir), replication.CleanDir(opts.FS, opts.Upload.TempDir)); err != nil {
		log.Close()
		return nil, fmt.Errorf("engine: %w", err)
	}
	encoder, err := part.NewEncoder(opts.BlockSize, opts.Seal.Concurrency)
	if err != nil {
		log.Close()
		return nil, err
	}
	scheduler, err := sealer.NewScheduler(opts.Seal)
	if err != nil {
		encoder.Close()
		log.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	e := &Engine{
		opts: opts, log: log, set: set,
		store:  ownership.NewStoreWithOptions(ownership.StoreOptions{Logger: opts.Logger, Clock: opts.Clock, AuthorityName: set.Authority().Name}, set.Authority().Bucket, set.Others()...),
		sealer: scheduler, encoder: encoder, partsDir: partsDir, stop: make(chan struct{}), done: make(chan struct{}),
	}
	e.closing, e.cancelClosing = context.WithCancel(context.Background())
	e.inst.acquired = make(chan struct{})
	e.mu.shards = make(map[string]*shard.Shard)
	e.mu.owners = make(map[string]*ownership.Owner)
	e.mu.opening = make(map[string]bool)
	e.metrics = newMetrics(e) // its collectors read the tail only when collected
	e.events = e.newEvents()
	e.openTail()
	upOpts := opts.Upload
	upOpts.ObserveLag = e.events.PartReplicated // which tells opts.Upload.ObserveLag too
	e.uploader = replication.NewUploader(set, upOpts, opts.FS, opts.Clock)
	if err := e.metrics.register(opts.Registerer); err != nil {
		e.tail.Close(context.Background())
		e.uploader.Close()
		scheduler.Close()
		encoder.Close()
		log.Close()
		return nil, err
	}
	go e.renewLease()
	return e, nil
}

// instanceID returns the id kept in dir/instance, creating it on the first open.
func instanceID(fsys vfs.FS, dir string) (string, error) {
	path := filepath.Join(dir, "instance")
	if b, err := fsutil.ReadFile(fsys, path); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("engine: %w", err)
	}
	var r [8]byte
	rand.Read(r[:])
	id := "l0-" + hex.EncodeToString(r[:])
	if err := fsutil.WriteFileAtomic(fsys, path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("engine: %w", err)
	}
	return id, nil
}

// owners returns the owners of the open shards by shard id, a copy to use without
// e.mu, and whether the engine is closed.
func (e *Engine) owners() (map[string]*ownership.Owner, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.mu.owners), e.mu.closed
}

// Instance returns the id this engine holds leases as.
func (e *Engine) Instance() string { return e.opts.Instance }

// Options returns the options the engine runs with: those it was opened with,
// defaults filled in.
func (e *Engine) Options() Options { return e.opts }

// OpenOption changes how OpenShard takes a shard.
type OpenOption func(*openOptions)

// openOptions are what the OpenOptions of an OpenShard set.
type openOptions struct {
	wait bool // for a lease another instance holds to run out
}

// WaitForLease makes OpenShard wait for a lease another instance holds to expire,
// instead of failing with ErrOwned.
func WaitForLease() OpenOption { return func(o *openOptions) { o.wait = true } }

// OpenShard opens shard id: it takes the shard's lease, which fences any earlier
// owner, settles the WAL against the manifest, and arms a seal of any pages the
// engine before it left unsealed, so they are sealed at once rather than when they
// age. Offsets continue where the shard's last acknowledged record left
// them. The id must pass shard.ValidateID; a shard is open at most once per engine
// (ErrShardOpen) until its Close or Retire.
func (e *Engine) OpenShard(ctx context.Context, id string, opts ...OpenOption) (*shard.Shard, error) {
	if err := shard.ValidateID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	if _, ok := e.mu.shards[id]; ok || e.mu.opening[id] {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrShardOpen, id)
	}
	e.mu.opening[id] = true // the takeover talks to the object store: not under mu
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.mu.opening, id)
		e.mu.Unlock()
	}()

	// Close ends a takeover in progress (one waiting for a lease, say) at once.
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.closing, cancel)()
	owner, armed, err := e.takeOver(tctx, id, opts)
	if err != nil {
		if e.closing.Err() != nil {
			return nil, fmt.Errorf("%w: %w", ErrClosed, err)
		}
		return nil, err
	}
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		if err := shardlink.ReleaseLeaving(ctx, e.log, shardTail{e.tail}, owner, id); err != nil {
			return nil, fmt.Errorf("%w: the lease taken meanwhile was not given back: %w", ErrClosed, err)
		}
		return nil, ErrClosed
	}
	opened, err := shardlink.Open(id, shardlink.Config{
		Log: e.log, Owner: owner, Replicas: e.set, Sealer: e.sealer, Uploader: e.uploader,
		UploadWait: e.opts.Lease.Duration,
		PartsDir:   e.partsDir, FS: e.opts.FS, BlockSize: e.opts.BlockSize, Encoder: e.encoder, SizeTrigger: e.opts.Seal.SizeBytes,
		MaxRecordSize: e.opts.MaxRecordSize, MaxBatchBytes: e.opts.MaxBatchBytes,
		Clock: e.opts.Clock, Tail: shardTail{e.tail},
		Events: shardlink.Events{AppendEnded: e.events.AppendEnded, ShardClosed: e.events.ShardClosed},
	}, armed)
	if err != nil {
		e.mu.Unlock()
		e.orphaned(id) // owned under the instance lease, and served by no one
		return nil, err
	}
	sh := opened.(*shard.Shard)
	e.mu.shards[id] = sh
	e.mu.owners[id] = owner
	e.mu.Unlock() // what follows talks to the object store: not under mu

	if e.opts.BackfillOnOpen {
		if _, err := e.backfill(id, owner); err != nil {
			e.opts.Logger.Error("engine: backfill at open", "shard", id, "err", err)
		}
	} else {
		e.warnIfUnderReplicated(id, owner)
	}
	return sh, nil
}

// forget drops a closed shard, so it can be opened again.
func (e *Engine) forget(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.mu.shards, id)
	delete(e.mu.owners, id)
}

// openShards returns the shards open now.
func (e *Engine) openShards() []*shard.Shard {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*shard.Shard, 0, len(e.mu.shards))
	for _, sh := range e.mu.shards {
		out = append(out, sh)
	}
	return out
}

// waitShardsGone waits until every shard has closed or retired, and no open is in
// progress (one that lands now finds the engine closed and releases).
func (e *Engine) waitShardsGone(ctx context.Context) error {
	for {
		e.mu.Lock()
		n := len(e.mu.shards) + len(e.mu.opening)
		e.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine: close: %d shards still closing: %w", n, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// renewConcurrency bounds the confirmations after a lapse of the instance lease
// (and the retirements at Close) in flight.
const renewConcurrency = 32

// Close retires every shard still open (each stops intake, waits for its appends in
// flight and releases its lease without sealing: the next open on this Dir seals
// the pages), stops the seals and renewals, closes the WAL, and unregisters the
// metrics. Close shards with Shard.Close first for a cooperative handoff. Later
// calls fail with ErrClosed. It releases the instance lease, unless in Local mode a
// shard's retire failed (its pages could not be shipped, or their end recorded):
// the lease then runs out, and an open of this Dir before it does ships them.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.mu.closed = true
	e.cancelClosing()
	e.mu.Unlock()

	// Renewals stop first, so that one deadline bounds everything: after a lease's
	// duration, the instance lease has run out if its release failed.
	close(e.stop)
	<-e.done
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.Lease.Duration)
	defer cancel()
	var (
		errs []error
		kept bool // a shard's lease was kept
		mu   sync.Mutex
		wg   sync.WaitGroup
		sem  = make(chan struct{}, renewConcurrency)
	)
	// The shards retire together: one after another, a thousand shards' releases
	// outran the deadline and left the last ones leased.
	for _, sh := range e.openShards() {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := sh.Retire(ctx); err != nil && !errors.Is(err, shard.ErrClosed) {
				mu.Lock()
				errs = append(errs, err)
				// A shard whose retire failed keeps its lease, unless another
				// owner fenced it; in Local mode any failure may leave
				// acknowledged pages on this Dir alone.
				kept = kept || !errors.Is(err, ErrFenced) || e.opts.Durability == Local
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// A Shard.Close the caller started may still be sealing, uploading or
	// releasing, and an OpenShard taking a lease: the WAL, the uploader and the
	// copies they need stay up until they end.
	e.stopOrphans()
	if err := e.waitShardsGone(ctx); err != nil {
		errs = append(errs, err)
	}
	// A shard's lease is held under the instance lease: releasing it would hand
	// over a shard whose retire kept its lease. In Local mode that shard's
	// acknowledged pages may be on this Dir alone (not shipped, or not where its
	// manifest points), and a new owner taking it at once would read a history
	// without them; kept, the lease runs out, and an open of this Dir before then
	// ships them. So too for a shard retired before Close whose pages could not
	// be shipped (its retire failed, and kept its lease), or one a restart kept
	// owned (the lease still carries the previous engine's token) and did not
	// give back yet: the lease is kept while, in Local mode, any page is
	// unshipped, or while any such shard is left.
	if e.opts.Durability == Local && e.tail.Stats().Pending > 0 {
		kept = true
	}
	if h := e.heldLease(); h != nil && h.Carries() {
		// In either mode now: the previous engine may have run in Local mode.
		kept = true
	}
	e.releaseLease(ctx, kept)
	e.sealer.Close()
	e.uploader.Close()
	// Every shard shipped its pages as it retired; an append that failed is all
	// that can be left, and its caller was told its outcome is unknown.
	if err := e.tail.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("engine: close: the tail: %w", err))
	}
	// The releases' copies go out before the engine stops copying (within the same
	// deadline); a replica they miss is brought up to date by the next owner.
	if err := e.store.Flush(ctx); err != nil {
		e.opts.Logger.Warn("engine: close: manifest copies", "err", err)
	}
	e.store.Close()
	e.metrics.unregister()
	if err := e.log.Close(); err != nil {
		errs = append(errs, fmt.Errorf("engine: %w", err))
	}
	e.encoder.Close()
	return errors.Join(errs...)
}

// openTail starts the engine's tail on the tail replica: every page the WAL
// takes is shipped there, in incarnation after incarnation (see tail.Tail).
func (e *Engine) openTail() {
	e.tailReplica = e.opts.Tail.Replica
	if e.tailReplica == "" {
		e.tailReplica = e.set.Authority().Name
	}
	spec, _ := e.set.Get(e.tailReplica)
	e.tail = tail.Open(tail.Options{
		Bucket: spec.Bucket, Instance: e.opts.Instance,
		NextIncarnation: tail.IncarnationFile(e.opts.FS, e.opts.Dir),
		Flush: tail.FlushOptions{
			Interval: e.opts.Tail.Interval, Bytes: e.opts.Tail.Bytes, Retry: e.opts.Tail.Retry,
			Clock: e.opts.Clock, Shipped: e.events.TailShipped,
		},
		Taken: e.shardTaken,
		Collect: tail.CollectOptions{
			Every: e.opts.Tail.CollectEvery, After: e.opts.Tail.CollectAfter,
			View: e.tailView, Collected: func(n int) { e.metrics.collected.Add(float64(n)) },
			Dead: e.deadInstances,
		},
		Logger: e.opts.Logger,
	})
	e.log.ShipTo(e.tail.Sink(e.opts.Tail.MaxUnshippedBytes, e.opts.Tail.MaxUnshippedAge),
		wal.ShipOptions{Remote: e.opts.Durability == Remote})
}

// tailView is what collection needs of a shard's manifest: the owner's view
// while it holds the lease, unless a write of its may have landed unseen, or
// else the authority's.
func (e *Engine) tailView(ctx context.Context, id string) (tail.View, error) {
	e.mu.Lock()
	o := e.mu.owners[id]
	e.mu.Unlock()
	var m manifest.Manifest
	if o != nil && o.Valid() == nil && o.Settled() {
		m = o.Manifest()
	} else {
		var err error
		if m, _, err = e.store.Load(ctx, id); err != nil {
			return tail.View{}, err
		}
	}
	v := tail.View{Epoch: m.Epoch, Sealed: m.Sealed}
	if t := m.Tail; t != nil && t.Replica == e.tailReplica {
		p := tail.PointerOf(t)
		v.Pointer = &p
	}
	return v, nil
}

// shardTaken fences the owner here of a shard that a takeover elsewhere marked
// taken at epoch in this instance's chain: its pages under that epoch are no
// longer shipped, so nothing more of it may be acknowledged.
func (e *Engine) shardTaken(id string, epoch uint64) {
	e.mu.Lock()
	o := e.mu.owners[id]
	e.mu.Unlock()
	if o != nil && o.Epoch() == epoch {
		o.Fence("a takeover marked it in this instance's tail chain")
		e.opts.Logger.Warn("engine: a shard was taken over by another instance", "shard", id, "epoch", epoch)
	}
}

// shardTail tells a shard where its pages are in the tail.
type shardTail struct{ t *tail.Tail }

func (s shardTail) From(shard string, offset uint64) (uint64, uint64, bool) {
	at, ok := s.t.From(shard, offset)
	return at.Incarnation, at.Sequence, ok
}

func (s shardTail) Sealed(shard string, floor uint64) { s.t.Forget(shard, floor) }

func (s shardTail) Until(ctx context.Context, shard string) (uint64, uint64, bool, error) {
	at, ok, err := s.t.Until(ctx, shard)
	return at.Incarnation, at.Sequence, ok, err
}
