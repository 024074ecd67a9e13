package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
)

// afterCommit queues the copies of a part the shard just sealed to every replica but
// the first, from its local file, which the engine keeps until the copies end.
func (e *Engine) afterCommit(id string, p manifest.Part, file string) (keep bool) {
	targets := e.missing(p)
	if len(targets) == 0 {
		return false
	}
	e.mu.Lock()
	e.mu.files[p.Key] = file
	e.mu.Unlock()
	err := e.uploader.Enqueue(replica.Job{
		Shard: id, Key: p.Key, Size: p.Size, CRC: p.CRC, Source: replica.FromFile(file),
		Targets: targets, SealedAt: p.SealedAt, Done: func(error) { e.dropFile(p.Key, file) },
	})
	if err != nil { // closed: the part stays short until a backfill
		e.dropFile(p.Key, file)
	}
	return true
}

func (e *Engine) dropFile(key, file string) {
	e.mu.Lock()
	if e.mu.files[key] == file {
		delete(e.mu.files, key)
	}
	e.mu.Unlock()
	e.opts.FS.Remove(file)
}

// missing returns the replicas of the set that p's manifest entry does not name.
func (e *Engine) missing(p manifest.Part) []string {
	var out []string
	for _, sp := range e.set.Specs() {
		if !slices.Contains(p.Replicas, sp.Name) {
			out = append(out, sp.Name)
		}
	}
	return out
}

// recordReplica is the uploader's Recorder: the shard's owner adds the location and
// publishes the manifest to every replica.
func (e *Engine) recordReplica(ctx context.Context, j replica.Job, name string) error {
	e.mu.Lock()
	owner := e.mu.owners[j.Shard]
	e.mu.Unlock()
	if owner == nil {
		return fmt.Errorf("engine: shard %q is not open here: the copy of %s on %s stays unrecorded until a backfill", j.Shard, j.Key, name)
	}
	return owner.AddReplica(ctx, j.Key, name)
}

// BackfillUnderReplicated queues a copy of every part of the open shards that some
// replica of the set lacks, onto the uploader, and returns how many parts it
// queued. A part sealed in this process is read from its local file while it has
// one; any other from the first replica, in the set's order, that the manifest says
// holds it. Parts whose copies are already queued or running are left to them. A
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

// backfill queues the copies one shard's parts lack.
func (e *Engine) backfill(id string, o *manifest.Owner) (int, error) {
	if e.set.Len() < 2 {
		return 0, nil
	}
	var jobs []replica.Job
	var errs []error
	for _, p := range o.Manifest().Parts {
		targets := e.missing(p)
		if len(targets) == 0 || e.uploader.Pending(p.Key) {
			continue
		}
		src, ok := e.source(p)
		if !ok {
			errs = append(errs, fmt.Errorf("engine: shard %q part %s: no replica of this set holds it (%v)", id, p.Key, p.Replicas))
			continue
		}
		jobs = append(jobs, replica.Job{Shard: id, Key: p.Key, Size: p.Size, CRC: p.CRC, Source: src, Targets: targets})
	}
	if err := e.uploader.Enqueue(jobs...); err != nil {
		return 0, err
	}
	return len(jobs), errors.Join(errs...)
}

// source picks where a backfill reads p: its local file, else the first replica of
// the set that holds it.
func (e *Engine) source(p manifest.Part) (replica.UploadSource, bool) {
	e.mu.Lock()
	file, ok := e.mu.files[p.Key]
	e.mu.Unlock()
	if ok {
		return replica.FromFile(file), true
	}
	for _, sp := range e.set.Specs() {
		if slices.Contains(p.Replicas, sp.Name) {
			return replica.FromReplica(sp.Name, p.Key), true
		}
	}
	return replica.UploadSource{}, false
}

// FlushAndWaitUploads waits until every page given to the tail is shipped, and no
// copy of a part is queued or running, and then until every replica holds the
// manifests as last published (or a copy's attempt failed: its error).
func (e *Engine) FlushAndWaitUploads(ctx context.Context) error {
	if err := e.tail.cur.Load().flusher.WaitRoom(ctx, 1, 0); err != nil {
		return fmt.Errorf("engine: flush the tail: %w", err)
	}
	if err := e.uploader.Flush(ctx); err != nil {
		return err
	}
	return e.store.Flush(ctx)
}

// warnIfUnderReplicated logs, once per engine, that parts lack copies and nothing
// will make them: without backfill the other replicas are not a recoverable copy.
func (e *Engine) warnIfUnderReplicated(id string, o *manifest.Owner) {
	if e.set.Len() < 2 || e.warnedUnderReplicated.Load() {
		return
	}
	short := e.set.Assess(appendPartReplicas(nil, o.Manifest().Parts), e.uploader.Pending).Stuck
	if short > 0 && e.warnedUnderReplicated.CompareAndSwap(false, true) {
		e.opts.Logger.Warn("engine: parts lack copies on some replicas and no upload will make them: those replicas are not a recoverable copy; call BackfillUnderReplicated or set Options.BackfillOnOpen",
			"shard", id, "parts", short, "replicas", e.set.Len())
	}
}
