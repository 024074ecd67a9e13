package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
)

// takeOver takes shard id over, as one unit, and returns its owner and whether it
// has a backlog to seal at once:
//
//  1. Inspect the manifest (waiting for a lease another instance holds, with
//     WaitForLease).
//  2. If that instance's lease ran out unreleased, fence its tail stream, so that
//     it can acknowledge nothing more, and inspect again: what it committed before
//     the fence is in the manifest now.
//  3. Settle the WAL: if the pages it holds are this engine's own from the
//     previous ownership (a restart, or a lag move back to this Dir), they are
//     the backlog when they hold everything this instance shipped of the shard
//     to its tail, which is read to check (an open without the tail's replica
//     refuses); otherwise they were superseded, and the backlog is what the
//     previous owner shipped to its tail past the sealed watermark, imported.
//  4. Ship the backlog to this engine's tail under the new epoch.
//  5. Publish the takeover, pointing the manifest at this engine's tail; if
//     another write came first, start again.
//
// Everything before the publish is safe to redo: a crash, a lost reply or a lost
// race leaves the WAL at the new epoch with the backlog, and a tail object no
// manifest points at; the next attempt decides again from the manifest. Deciding
// after the publish would not be: once the manifest names this instance at the
// WAL's epoch, superseded pages look like ours.
func (e *Engine) takeOver(ctx context.Context, id string, opts []OpenOption) (*ownership.Owner, bool, error) {
	var oo openOptions
	for _, o := range opts {
		o(&oo)
	}
	lopts := e.opts.ownership()
	lopts.Wait = oo.wait
	held, err := e.lease(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("engine: open shard %q: %w", id, err)
	}
	for {
		owner, taken, err := e.takeOverOnce(ctx, id, held, lopts)
		if errors.Is(err, manifest.ErrMoved) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("engine: open shard %q: %w", id, err)
		}
		e.metrics.tailTaken.Add(float64(taken))
		if owner.Lapsed() {
			// The takeover was found landed by reading back, which confirms no
			// generation of the lease: confirm it now rather than at the next
			// renewal, so that the shard takes appends at once.
			if err := owner.Confirm(ctx); errors.Is(err, manifest.ErrFenced) {
				return nil, false, fmt.Errorf("engine: open shard %q: %w", id, err)
			}
		}
		return owner, e.log.Info(id).Pages > 0, nil
	}
}

// takeOverOnce is one attempt of takeOver, and how many records it read from the
// previous owner's tail; manifest.ErrMoved means start again.
func (e *Engine) takeOverOnce(ctx context.Context, id string, held *lease.Held, opts ownership.LeaseOptions) (*ownership.Owner, int, error) {
	// The tail's first incarnation is live in the chain (the previous process's
	// fenced and ended) before anything of this instance's tail is read.
	if _, err := e.tail.Position(ctx); err != nil {
		return nil, 0, fmt.Errorf("engine: the tail: %w", err)
	}
	c, err := ownership.Inspect(ctx, e.store, id, e.opts.Instance, opts)
	if err != nil {
		return nil, 0, err
	}
	prev := c.Prev
	walEpoch := e.log.Info(id).Epoch
	if walEpoch > prev.Epoch+1 {
		// The WAL saw a later epoch than the manifest holds: the bucket is not the
		// one this engine used, or lost its manifest. Adopting now could drop
		// acknowledged records; refuse.
		return nil, 0, fmt.Errorf("%w: the WAL carries epoch %d of shard %q, the manifest on %s only %d",
			ErrManifestBehind, walEpoch, id, e.set.Authority().Name, prev.Epoch)
	}
	// The WAL's pages are the previous owner's (ours) if we took the previous
	// epoch: the WAL carries it, or the one after it from a takeover of ours that a
	// crash (or a lost reply) kept from being seen.
	ours := prev.Owner == e.opts.Instance && (walEpoch == prev.Epoch || walEpoch == prev.Epoch+1)
	epoch := c.Epoch()
	var (
		taken int
		recs  [][]byte
		read  bool // recs is the history read from the tail
	)
	if ours && prev.Tail != nil {
		// What this instance shipped is in its own tail, which a WAL restored
		// from an older copy of the Dir lacks, and so does one whose page was
		// shipped while a crash cut its fsync short (a reader of the tail may
		// have returned it): read it (through the chain, to the ends the
		// earlier processes left) and keep the WAL only if it holds all of it.
		// An engine reopened without the replica the pointer names cannot
		// check, and readTail refuses with ErrTailMissing: keeping the WAL
		// unchecked could give such a page's offset to another record.
		h, _, err := e.readTail(ctx, prev)
		if err != nil {
			return nil, 0, err
		}
		if behind, err := e.walBehind(id, prev.Sealed, h); err != nil {
			return nil, 0, err
		} else if behind {
			e.opts.Logger.Warn("engine: the WAL lacks records this instance shipped of the shard (a Dir restored from an older copy?): taking the tail's history",
				"shard", id, "sealed", prev.Sealed, "records", len(h))
			ours, recs, read = false, h, true
		}
	}
	if ours {
		if err := e.log.SetEpoch(id, epoch); err != nil {
			return nil, 0, err
		}
		// Drop what the manifest says is sealed (a seal that committed and did not
		// truncate); keep the rest as the backlog.
		if _, err := e.log.Adopt(id, epoch, prev.Sealed, true); err != nil {
			return nil, 0, err
		}
	} else {
		if !read {
			var fenced bool
			if recs, fenced, err = e.readTail(ctx, prev); err != nil {
				return nil, 0, err
			}
			if fenced {
				// The fence stops the previous owner's acknowledgements; what it
				// committed before is in the manifest now, and its tail is read to
				// the fence again from there.
				again, err := ownership.Inspect(ctx, e.store, id, e.opts.Instance, opts)
				if err != nil {
					return nil, 0, err
				}
				if again.Prev.Seq != prev.Seq {
					return nil, 0, fmt.Errorf("%w: the manifest moved while the tail was fenced", manifest.ErrMoved)
				}
			}
		}
		if err := e.supersede(id, walEpoch, prev, recs); err != nil {
			return nil, 0, err
		}
		if err := e.log.SetEpoch(id, epoch); err != nil {
			return nil, 0, err
		}
		if err := e.log.Import(id, epoch, prev.Sealed, prev.Sealed, recs); err != nil {
			return nil, 0, err
		}
		taken = len(recs)
	}
	// Pages given to the tail from now on are at or after at, in its
	// incarnation then or a later one the chain lists.
	at, err := e.tail.Position(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("engine: the tail: %w", err)
	}
	if err := e.shipBacklog(ctx, id, epoch, prev.Sealed); err != nil {
		return nil, 0, err
	}
	o, err := ownership.Take(ctx, e.store, c, held, opts, e.tailPointer(at))
	if err != nil {
		return nil, 0, e.takeoverFailed(id, c, err)
	}
	return o, taken, nil
}

// walBehind reports whether the WAL's records of the shard from sealed on lack
// some of history, the shard's records from sealed on that this instance shipped:
// the WAL holds fewer, or others at the same offsets.
func (e *Engine) walBehind(id string, sealed uint64, history [][]byte) (bool, error) {
	if len(history) == 0 {
		return false, nil
	}
	info := e.log.Info(id)
	if info.Next < sealed+uint64(len(history)) || info.Floor > sealed {
		return true, nil
	}
	compared := 0
	for p, err := range e.log.Pages(id, sealed) {
		if err != nil {
			return false, err
		}
		for i, r := range p.Records {
			off := p.FirstOffset + uint64(i)
			if off < sealed {
				continue
			}
			k := off - sealed
			if k >= uint64(len(history)) {
				return false, nil
			}
			if !bytes.Equal(history[k], r) {
				return true, nil
			}
			compared++
		}
	}
	return compared < len(history), nil
}

// takeoverFailed is the end of a takeover whose publish failed with err. One whose
// outcome is not certain (the write may have landed, or may land later, on the
// version c read) is ErrUnknownOutcome, and the shard is kept as an orphan: if the
// write lands, the shard is owned under the instance lease and open nowhere, and
// nobody else could take it while this engine lives; the orphan pass gives it
// back.
//
// Take tells the two apart: ErrMoved is a write refused, and any failure of a
// write that was sent, whatever reading back found, is ErrUnknownOutcome.
func (e *Engine) takeoverFailed(id string, c ownership.Claim, err error) error {
	if errors.Is(err, manifest.ErrUnknownOutcome) {
		e.takeoverOrphaned(id, c.Version())
	}
	return err
}

// supersede drops the shard's pages that this WAL holds of an ownership another
// instance has superseded, durably, before a takeover can be published, so that a
// later attempt finds nothing left to drop. Of those records, the ones at or past
// the sealed watermark that the history does not hold (tailed: the previous
// owner's records from there) are counted stranded: acknowledged here, in no one's
// history. Those below the watermark count as carried: the offsets were sealed by
// a later owner, which in Remote mode adopted every record this engine
// acknowledged (in Local mode, a record never shipped may have been replaced, and
// goes uncounted; the unshipped-window gauges are that loss's measure).
//
// In Remote mode the records in no one's history are counted apart, as
// unacknowledged: an append is acknowledged there only once its page is shipped,
// and the next owner read every page shipped before its fence, so a page the
// history lacks was never shipped, and its append was never acknowledged. They
// are the pages of appends that ended without an outcome (or never returned, the
// machine lost); dropping them loses nothing acknowledged, and stranded stays 0.
// The mode is this engine's now: a Dir written in Local mode and reopened in Remote
// mode would count its Local records as unacknowledged.
func (e *Engine) supersede(id string, walEpoch uint64, prev manifest.Manifest, tailed [][]byte) error {
	info := e.log.Info(id)
	if info.Pages == 0 && info.Next == prev.Sealed {
		return nil
	}
	var stranded uint64
	for p, err := range e.log.Pages(id, max(prev.Sealed, info.Floor)) {
		if err != nil {
			return err
		}
		for i, r := range p.Records {
			off := p.FirstOffset + uint64(i)
			if off < prev.Sealed {
				continue
			}
			if k := off - prev.Sealed; k >= uint64(len(tailed)) || !bytes.Equal(tailed[k], r) {
				stranded++
			}
		}
	}
	if _, err := e.log.Adopt(id, walEpoch, prev.Sealed, false); err != nil {
		return err
	}
	if stranded > 0 && e.opts.Durability == Remote {
		e.metrics.unacked.Add(float64(stranded))
		e.opts.Logger.Info("engine: dropped records never acknowledged (their pages were never shipped) another owner superseded",
			"shard", id, "records", stranded, "sealed", prev.Sealed, "owner", prev.Owner, "epoch", prev.Epoch)
	} else if stranded > 0 {
		e.metrics.stranded.Add(float64(stranded))
		e.opts.Logger.Error("engine: dropped acknowledged records another owner superseded",
			"shard", id, "records", stranded, "sealed", prev.Sealed, "owner", prev.Owner, "epoch", prev.Epoch)
	}
	return nil
}

// tailPointer is the pointer of a shard whose pages this engine ships from at on.
func (e *Engine) tailPointer(at tail.Position) *manifest.Tail {
	return &manifest.Tail{Replica: e.tailReplica, Instance: e.opts.Instance, Incarnation: at.Incarnation, From: at.Sequence}
}

// readTail reads the records past the sealed watermark that the previous owner of
// a shard shipped, as prev points at them (see tail.ReadHistory): up to the end
// its release recorded, or else through the instance's chain, marking the shard
// taken and fencing the live incarnation first. It returns the records from
// prev.Sealed on, and whether it had to fence.
func (e *Engine) readTail(ctx context.Context, prev manifest.Manifest) (recs [][]byte, fenced bool, err error) {
	t := prev.Tail
	if t == nil {
		return nil, false, nil
	}
	spec, ok := e.set.Get(t.Replica)
	if !ok {
		return nil, false, fmt.Errorf("%w: shard %q: its tail is on replica %q, which this engine does not have", ErrTailMissing, prev.Shard, t.Replica)
	}
	p := tail.PointerOf(t)
	released := prev.Released && t.Until != 0
	if !released {
		p.Until = tail.Position{} // an end recorded by an owner that did not release is not one
	}
	opts := tail.HistoryOptions{Take: !released}
	if t.Instance == e.opts.Instance {
		// This instance's own tail, written by an earlier process (fenced and
		// ended as this one's tail started) or by this one, which holds nothing of
		// the shard under that epoch: read what the chain ended, mark nothing.
		opts = tail.HistoryOptions{Below: e.tail.Incarnation()}
	}
	h, err := tail.ReadHistory(ctx, spec.Bucket, p, prev.Shard, prev.Epoch, prev.Sealed, opts)
	if errors.Is(err, tail.ErrMissing) {
		return nil, false, fmt.Errorf("%w: %w", ErrTailMissing, err)
	}
	if err != nil {
		return nil, false, fmt.Errorf("engine: shard %q: read the tail: %w", prev.Shard, err)
	}
	if h.Fenced {
		e.metrics.fenceWritten(h.Wrote)
	}
	return h.Records, h.Fenced, nil
}

// shipBacklog gives the tail the shard's pages from sealed on, under epoch, and
// waits until they are shipped: the tail a manifest points at must hold
// everything past the sealed watermark.
func (e *Engine) shipBacklog(ctx context.Context, id string, epoch, sealed uint64) error {
	last, err := e.log.Reship(id, epoch, sealed)
	if err != nil || last == nil {
		return err
	}
	if err := last.Wait(ctx); err != nil {
		return fmt.Errorf("engine: shard %q: ship the backlog: %w", id, err)
	}
	return nil
}
