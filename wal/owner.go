package wal

import (
	"fmt"
)

// SetEpoch makes epoch the shard's owner epoch, durably: from now on only appends
// and truncations carrying it are taken. An engine sets it before it publishes the
// epoch as the shard's owner, so that after a crash the log says which owner its
// pages belong to. An epoch never goes back: one below the shard's is refused with
// ErrStaleEpoch, and the shard's own is set again.
func (l *Log) SetEpoch(shard string, epoch uint64) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	st := l.state(shard)
	st.mu.Lock()
	if cur := st.mu.epoch; epoch < cur {
		st.mu.Unlock()
		return fmt.Errorf("wal: set epoch of shard %q: epoch %d, the shard's is %d: %w", shard, epoch, cur, ErrStaleEpoch)
	}
	if _, err := l.logShardEntry(entryEpoch, shard, epoch); err != nil {
		st.mu.Unlock()
		return fmt.Errorf("wal: set epoch of shard %q: %w", shard, err)
	}
	st.mu.epoch = epoch
	st.epochMark.Store(epoch)
	st.mu.Unlock()
	// The watermark claims the epoch before SetEpoch returns, so that damage to the
	// group holding it is reported at open, after a crash as after a clean Close.
	// SetEpoch is rare (an owner's takeover); those that run together share a
	// write. If the write fails the epoch holds all the same (its entry is durable)
	// and the error is returned; the watermark writer tries again.
	if err := l.coverMarks(l.changes.Add(1)); err != nil {
		return fmt.Errorf("wal: set epoch of shard %q: %w", shard, err)
	}
	return nil
}

// Adopt settles the shard's pages against its sealed watermark when an owner opens
// it, in one synced batch. With keep, the pages are the new owner's backlog: those
// below sealed were sealed already and go, and the rest stay. Without keep, the
// pages belong to an ownership another instance has since superseded: all of them
// go and the shard continues at sealed. Adopt returns how many records it dropped
// that way: acknowledged here, never sealed by this log's owner, and superseded
// (stranded). The epoch must be the shard's.
//
// A sealed watermark inside a page, or below the floor, means the manifest and the
// log disagree about what was sealed; that is corruption, and nothing changes.
func (l *Log) Adopt(shard string, epoch, sealed uint64, keep bool) (stranded uint64, err error) {
	if err := l.enter(); err != nil {
		return 0, err
	}
	defer l.exit()
	st := l.state(shard)
	st.truncating.Lock()
	defer st.truncating.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case epoch != st.mu.epoch:
		return 0, fmt.Errorf("wal: adopt shard %q: epoch %d, the shard's is %d: %w", shard, epoch, st.mu.epoch, ErrStaleEpoch)
	case sealed < st.mu.floor:
		return 0, &CorruptionError{Shard: shard, Offset: sealed, Reason: fmt.Sprintf(
			"the manifest's sealed watermark %d is below the log's floor %d: sealed parts are missing from the manifest", sealed, st.mu.floor)}
	}
	if keep {
		return 0, l.adoptLocked(shard, st, sealed)
	}
	stranded = st.mu.next - st.mu.floor
	// The acknowledged watermark must never claim more than the log holds: lower it
	// durably before the log drops below it. (Raising it waits for the log.)
	if err := l.lowerAckedLocked(st, sealed); err != nil {
		return 0, err
	}
	return stranded, l.resetLocked(shard, st, sealed)
}

// Import replaces the shard's pages with recs, whose offsets start at first, for an
// owner that read them from another machine's tail: every page of the shard goes,
// the records at and above sealed become its pages, and the shard continues after
// them. It is one synced batch: a crash leaves the old pages or the new ones. The
// epoch must be the shard's, and first at or below sealed.
func (l *Log) Import(shard string, epoch, sealed, first uint64, recs [][]byte) error {
	if err := l.enter(); err != nil {
		return err
	}
	defer l.exit()
	if first > sealed {
		return fmt.Errorf("wal: import shard %q: records from %d, sealed watermark %d: %w", shard, first, sealed, ErrNotPageBoundary)
	}
	if skip := sealed - first; skip < uint64(len(recs)) {
		recs = recs[skip:]
	} else {
		recs = nil
	}
	st := l.state(shard)
	st.truncating.Lock()
	defer st.truncating.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case epoch != st.mu.epoch:
		return fmt.Errorf("wal: import shard %q: epoch %d, the shard's is %d: %w", shard, epoch, st.mu.epoch, ErrStaleEpoch)
	case sealed < st.mu.floor:
		return &CorruptionError{Shard: shard, Offset: sealed, Reason: fmt.Sprintf(
			"the sealed watermark %d of an import is below the log's floor %d: sealed parts are missing from the manifest", sealed, st.mu.floor)}
	}
	// As Adopt does: the acknowledged watermark must never claim more than the log
	// holds, so it is lowered durably before the log drops below it.
	if err := l.lowerAckedLocked(st, sealed+uint64(len(recs))); err != nil {
		return err
	}
	// The reset and the pages are one group: a crash leaves the old pages or the
	// new ones.
	now := l.opts.Clock.Now().UnixNano()
	var refs []pageRef
	l.w.mu.Lock()
	g, err := l.w.addLocked(func(buf []byte) []byte {
		l.w.noteLocked(entryReset, shard, sealed)
		return appendShardEntry(buf, entryReset, shard, sealed)
	})
	next, payload := sealed, uint64(0)
	for err == nil && len(recs) > 0 {
		// Pages as large as an append's: a tail section can hold many appends.
		n, size := 0, 0
		for n < len(recs) && n < importPageRecords && (n == 0 || size+len(recs[n]) <= importPageBytes) {
			size += len(recs[n])
			n++
		}
		var ref pageRef
		if ref, err = l.w.addPageLocked(shard, next, now, recs[:n], true); err == nil {
			refs = append(refs, ref)
			next, payload, recs = next+uint64(n), payload+uint64(size), recs[n:]
		}
	}
	l.w.mu.Unlock()
	if err == nil {
		err = g.wait()
	}
	if err != nil {
		return l.fail("import", err)
	}
	l.w.drop(st.mu.pages)
	st.setFloorLocked(sealed)
	st.mu.next, st.mu.pages, st.mu.payload = next, refs, payload
	st.mu.resets++
	st.acked.Store(next)
	st.resetMark.Store(g.seq)
	l.changes.Add(1)
	return nil
}

// Bounds on the pages Import writes.
const (
	importPageRecords = 1 << 16
	importPageBytes   = 4 << 20
)

// adoptLocked keeps the pages at and above sealed and drops the rest.
func (l *Log) adoptLocked(shard string, st *shardState, sealed uint64) error {
	if sealed >= st.mu.next {
		// Everything the log holds was sealed, perhaps more (a log that lost its
		// unsealed tail is refused at open by the watermark, not here).
		return l.resetLocked(shard, st, sealed)
	}
	return l.truncateLocked(shard, st, sealed)
}

// resetLocked drops every page of the shard, durably, and continues it at next.
func (l *Log) resetLocked(shard string, st *shardState, next uint64) error {
	seq, err := l.logShardEntry(entryReset, shard, next)
	if err != nil {
		return err
	}
	l.w.drop(st.mu.pages)
	st.setFloorLocked(next)
	st.mu.next, st.mu.pages, st.mu.payload = next, nil, 0
	st.mu.resets++
	st.acked.Store(next)
	st.resetMark.Store(seq)
	l.changes.Add(1)
	return nil
}
