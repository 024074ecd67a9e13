// Package shard is one shard of an engine: its append and read paths, and its
// seals, under its owner's lease. A Shard is opened by the engine
// (engine.OpenShard, or a fleet's Membership), which owns the WAL, the
// substrates, the seal scheduler and the metrics; this package holds what is
// specific to one shard.
//
// Records get dense offsets, starting at 0 for a new shard and continuing across
// reopens and owners. Empty records are refused (ErrEmptyRecord): a zero-length
// record cannot be told from a missing payload by most consumers of an event log, so
// an application that means "no payload" should say so in its own encoding.
//
// A shard acknowledges appends only while its owner's lease is valid; once the
// lease lapses or another instance takes the shard over, appends fail with an error
// that is manifest.ErrFenced.
package shard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/l0store/l0/internal/sealer"
	"github.com/l0store/l0/internal/shardlink"
	"github.com/l0store/l0/manifest"
)

var (
	// ErrInvalidID reports a shard id that ValidateID refuses.
	ErrInvalidID = errors.New("shard: invalid id")
	// ErrEmptyBatch reports an append of no records.
	ErrEmptyBatch = errors.New("shard: empty batch")
	// ErrEmptyRecord reports a record of zero bytes.
	ErrEmptyRecord = errors.New("shard: empty record")
	// ErrRecordTooLarge reports a record over engine.Options.MaxRecordSize.
	ErrRecordTooLarge = errors.New("shard: record too large")
	// ErrBatchTooLarge reports a batch over engine.Options.MaxBatchBytes or with more records
	// than a page holds.
	ErrBatchTooLarge = errors.New("shard: batch too large")
	// ErrClosed reports use of a Shard after Close, or after its engine closed.
	ErrClosed = errors.New("shard: closed")
	// ErrOutcomeUnknown reports an append whose records may have been written: they
	// reached the WAL, but the sync failed or the lease ended before it returned.
	// Every other append error is a refusal that wrote nothing.
	ErrOutcomeUnknown = errors.New("shard: append outcome unknown: the records may have been written")
	// ErrNoReachableReplica reports a part that no replica could serve.
	ErrNoReachableReplica = errors.New("shard: no reachable replica")
)

// Shard is one open shard. It is safe for concurrent use.
type Shard struct {
	id     string
	cfg    shardlink.Config
	epoch  uint64
	doubts sealer.Doubts // parts whose commit had an unknown outcome

	// mu is held for reading by every append for its whole duration, so Close, which
	// takes it for writing, stops intake and waits for the appends in flight.
	mu struct {
		sync.RWMutex
		closed bool
	}
	stopped chan struct{} // closed when intake stops: wakes the following reads
	// acked is where a read of the WAL's pages ends: the end of the records
	// this handle acknowledged, or that were acknowledged before it opened.
	// Not the WAL's own: an append durable in the WAL after its lease ran out
	// returns ErrOutcomeUnknown, and no reader sees it until a later append is
	// acknowledged past it (or a seal commits it).
	acked struct {
		sync.Mutex
		end     uint64
		changed chan struct{} // closed, and cleared, when end moves; nil while nobody waits
	}
}

func init() {
	shardlink.Open = func(id string, cfg shardlink.Config, armed bool) (any, error) { return open(id, cfg, armed) }
}

// open opens shard id for its owner, whose epoch the WAL already carries (see
// engine.OpenShard). With armed, the shard has pages an earlier engine left
// unsealed, and the scheduler seals them at its first evaluation.
func open(id string, cfg shardlink.Config, armed bool) (*Shard, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	if cfg.Log == nil || cfg.Owner == nil || cfg.Replicas == nil || cfg.Sealer == nil || cfg.Uploader == nil ||
		cfg.Events.AppendEnded == nil || cfg.Events.ShardClosed == nil || cfg.Clock == nil ||
		cfg.MaxRecordSize <= 0 || cfg.MaxBatchBytes <= 0 {
		return nil, fmt.Errorf("shard %q: incomplete config", id)
	}
	s := &Shard{id: id, cfg: cfg, epoch: cfg.Owner.Epoch(), stopped: make(chan struct{})}
	s.acked.end = cfg.Log.Info(id).Acknowledged
	cfg.Sealer.Add(id, s, armed)
	return s, nil
}

// ID returns the shard's id.
func (s *Shard) ID() string { return s.id }

// Info is what a shard knows of itself without reading its records.
type Info struct {
	// Next is the offset the next appended record gets.
	Next uint64
	// Readable is where a Read ends now: the end of the acknowledged records.
	// Between it and Next are the appends in flight, which a read does not
	// return until they are acknowledged (and may never, if they fail).
	Readable uint64
	// Sealed is the offset after the last sealed record.
	Sealed uint64
	// Epoch is the owner epoch of this shard handle.
	Epoch uint64
	// UnsealedBytes is the size of the records not yet sealed, and Oldest when the
	// oldest of them was appended (zero when there are none).
	UnsealedBytes uint64
	Oldest        time.Time
}

// Info returns the shard's state.
func (s *Shard) Info() Info {
	wi := s.cfg.Log.Info(s.id)
	sealed := s.cfg.Owner.Sealed()
	acked, _ := s.watch()
	return Info{Next: wi.Next, Readable: max(acked, sealed), Sealed: sealed, Epoch: s.epoch, UnsealedBytes: wi.UnsealedBytes, Oldest: wi.Oldest}
}

// Fenced reports whether this handle's ownership ended for good (another instance
// took the shard over, or the engine's instance lease is gone, or the shard was
// released): it acknowledges nothing more, and only a new open of the shard can
// serve it again. A handle waiting for its lease's renewal is not fenced.
func (s *Shard) Fenced() bool { return s.cfg.Owner.Fenced() }

// Manifest returns the shard's manifest as this owner last published it.
func (s *Shard) Manifest() manifest.Manifest { return s.cfg.Owner.Manifest() }

// stopIntake marks the shard closed once, after the appends in flight. It reports
// false if the shard was closed already.
func (s *Shard) stopIntake() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return false
	}
	s.mu.closed = true
	close(s.stopped)
	return true
}

// Close is the cooperative close: it stops intake and waits for the
// appends in flight, seals everything still unsealed, and releases the lease, so the
// next owner takes the shard over at once with nothing to seal. If a seal fails the
// lease is kept (it runs out on its own, and an open on this engine's directory
// seals the rest) and the error returned. A nil error also means every replica
// holds the release; an error after the release says which did not (the lease is
// released all the same). Closing twice returns ErrClosed.
func (s *Shard) Close(ctx context.Context) error {
	if !s.stopIntake() {
		return fmt.Errorf("shard %q: %w", s.id, ErrClosed)
	}
	defer s.closed()
	s.cfg.Sealer.Remove(s.id, true)
	if err := s.cfg.Log.Settle(s.id); err != nil {
		return fmt.Errorf("shard %q: close: %w", s.id, err)
	}
	if err := s.sealAll(ctx); err != nil {
		return fmt.Errorf("shard %q: close: %w", s.id, err)
	}
	return s.handOver(ctx)
}

// Drain hands the shard over to another owner: it is Close, unless sealing takes
// longer than deadline (or fails); then it stops sealing and does what Retire
// does, so that the next owner reads the unsealed pages from the tail rather than
// waiting for them. forced reports the second. Either way the lease is released
// unless an error says otherwise.
func (s *Shard) Drain(ctx context.Context, deadline time.Duration) (forced bool, err error) {
	if !s.stopIntake() {
		return false, fmt.Errorf("shard %q: %w", s.id, ErrClosed)
	}
	defer s.closed()
	s.cfg.Sealer.Remove(s.id, true)
	if err := s.cfg.Log.Settle(s.id); err != nil {
		return false, fmt.Errorf("shard %q: drain: %w", s.id, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer s.cfg.Clock.AfterFunc(deadline, cancel)()
	if serr := s.sealAll(sctx); serr != nil {
		if ctx.Err() != nil {
			return false, fmt.Errorf("shard %q: drain: %w", s.id, serr)
		}
		if err := s.leave(ctx); err != nil {
			return true, fmt.Errorf("shard %q: drain past its deadline: %w", s.id, errors.Join(serr, err))
		}
		return true, nil
	}
	if err := s.handOver(ctx); err != nil {
		return false, err
	}
	return false, nil
}

// sealAll seals everything still unsealed.
func (s *Shard) sealAll(ctx context.Context) error {
	for {
		res, err := s.Seal(ctx, math.MaxUint64)
		if err != nil {
			return err
		}
		if !res.Cut {
			return nil
		}
	}
}

// handOver ends a cooperative close, everything sealed: it waits for the parts'
// copies, releases the lease, and waits for every replica to hold the release.
func (s *Shard) handOver(ctx context.Context) error {
	if err := s.waitUploads(ctx); err != nil && ctx.Err() != nil {
		return fmt.Errorf("shard %q: close: %w", s.id, err)
	}
	if err := s.cfg.Owner.Release(ctx); err != nil {
		return fmt.Errorf("shard %q: close: %w", s.id, err)
	}
	// The handover is complete when every replica shows the release, so that a
	// cold open from any of them starts where this owner stopped. A replica that
	// cannot take the copy does not undo the release, but Close says so.
	if err := s.cfg.Owner.WaitCopies(ctx); err != nil {
		return fmt.Errorf("shard %q: close: released, but not on every replica: %w", s.id, err)
	}
	return nil
}

// waitUploads waits for the copies of the shard's parts, at most UploadWait: they
// record their locations through this owner, so they should finish before it
// releases; but a replica that hangs must not hold the shard, and its lease, for
// as long as the uploader keeps trying.
func (s *Shard) waitUploads(ctx context.Context) error {
	if s.cfg.UploadWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.UploadWait)
		defer cancel()
	}
	select {
	case <-s.cfg.Uploader.Idle(s.id):
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for uploads: %w", ctx.Err())
	}
}

// closed reports the shard gone, with the parts still in doubt; their files go.
func (s *Shard) closed() {
	var parts []manifest.Part
	for _, d := range s.doubts.Take() {
		parts = append(parts, d.Part)
		sealer.RemoveFile(s.cfg.FS, d.File)
	}
	s.cfg.Events.ShardClosed(s.id, parts)
}

// Retire stops the shard at once for a lag move: it stops intake, cancels
// a seal in flight, waits for its pages to be shipped in the tail, and releases the
// lease without sealing, with the tail's end recorded. The unsealed pages stay in
// the WAL and in the tail, and the next open of the shard, on this engine's
// directory or on another machine's, seals them at once. A part whose commit had an
// unknown outcome is settled first, and if it was committed, copied: the next owner
// would not know to. If the pages cannot be shipped, the lease is kept: it runs
// out, and the next owner fences the tail and reads what was shipped.
func (s *Shard) Retire(ctx context.Context) error {
	if !s.stopIntake() {
		return fmt.Errorf("shard %q: %w", s.id, ErrClosed)
	}
	defer s.closed()
	s.cfg.Sealer.Remove(s.id, true)
	if err := s.leave(ctx); err != nil {
		return fmt.Errorf("shard %q: retire: %w", s.id, err)
	}
	return nil
}

// leave releases the lease without sealing (see Retire), intake stopped.
func (s *Shard) leave(ctx context.Context) error {
	if s.doubts.Len() > 0 {
		if committed, err := s.job().Settle(ctx); err == nil {
			s.copy(committed)
			s.waitUploads(ctx)
		}
	}
	return shardlink.ReleaseLeaving(ctx, s.cfg.Log, s.cfg.Tail, s.cfg.Owner, s.id)
}
