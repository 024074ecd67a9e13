package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/manifest"
)

// BackfillUnderReplicated queues a copy of every part of the open shards that some
// replica of the set lacks, onto the uploader, and returns how many parts it
// queued. Each is read from the first replica, in the set's order, that the
// manifest says holds it. Parts whose copies are already queued or running are
// left to them: those of a part sealed in this process read its local file. A
// single-replica set backfills nothing. Wait with FlushAndWaitUploads.
//
// It is idempotent: a copy that is already there is recorded again rather than
// written, and no location is ever removed.
func (e *Engine) BackfillUnderReplicated(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	owners, closed := e.owners()
	if closed {
		return 0, ErrClosed
	}
	var n int
	var errs []error
	for id, o := range owners {
		k, err := e.backfill(id, o)
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// backfill queues the copies one shard's parts lack, recorded by its owner o.
func (e *Engine) backfill(id string, o *ownership.Owner) (int, error) {
	if e.set.Len() < 2 {
		return 0, nil
	}
	var jobs []replication.Job
	var errs []error
	for _, p := range o.Manifest().Parts {
		targets := e.set.Missing(p.Replicas)
		if len(targets) == 0 || e.uploader.Pending(p.Key) {
			continue
		}
		src, ok := e.source(p)
		if !ok {
			errs = append(errs, fmt.Errorf("engine: shard %q part %s: no replica of this set holds it (%v)", id, p.Key, p.Replicas))
			continue
		}
		jobs = append(jobs, replication.Job{Shard: id, Key: p.Key, Size: p.Size, CRC: p.CRC, Source: src, Targets: targets, Recorder: o})
	}
	if err := e.uploader.Enqueue(jobs...); err != nil {
		return 0, err
	}
	return len(jobs), errors.Join(errs...)
}

// source picks where a backfill reads p: the first replica of the set that holds
// it.
func (e *Engine) source(p manifest.Part) (replication.Source, bool) {
	for _, sp := range e.set.Specs() {
		if slices.Contains(p.Replicas, sp.Name) {
			return replication.FromReplica(sp.Name, p.Key), true
		}
	}
	return replication.Source{}, false
}

// FlushAndWaitUploads waits until every page given to the tail is shipped, and no
// copy of a part is queued or running, and then until every replica holds the
// manifests as last published (or a copy's attempt failed: its error).
func (e *Engine) FlushAndWaitUploads(ctx context.Context) error {
	if err := e.tail.WaitRoom(ctx, 1, 0); err != nil {
		return fmt.Errorf("engine: flush the tail: %w", err)
	}
	if err := e.uploader.Flush(ctx); err != nil {
		return err
	}
	return e.store.Flush(ctx)
}

// warnIfUnderReplicated logs, once per engine, that parts lack copies and nothing
// will make them: without backfill the other replicas are not a recoverable copy.
func (e *Engine) warnIfUnderReplicated(id string, o *ownership.Owner) {
	if e.set.Len() < 2 || e.warnedUnderReplicated.Load() {
		return
	}
	short := e.set.Assess(appendPartReplicas(nil, o.Manifest().Parts), e.uploader.Pending).Stuck
	if short > 0 && e.warnedUnderReplicated.CompareAndSwap(false, true) {
		e.opts.Logger.Warn("engine: parts lack copies on some replicas and no upload will make them: those replicas are not a recoverable copy; call BackfillUnderReplicated or set Options.BackfillOnOpen",
			"shard", id, "parts", short, "replicas", e.set.Len())
	}
}
