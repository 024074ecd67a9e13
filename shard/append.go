package shard

import (
	"context"
	"errors"
	"fmt"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/wal"
)

// Append writes recs as one batch and returns the offset of the first record once
// the batch is durable; the others follow at first+1, first+2, ... Appends to one
// shard are ordered; the batch is all or nothing.
//
// Every error says whether the records may have been written. An error that is
// ErrOutcomeUnknown means they may have been: the batch reached the WAL, and then
// the sync failed, or the lease ran out before it returned; the records may become
// history (a later owner on this Dir adopts them), so a caller must not simply
// append them again, but read to find out. Any other error is a refusal that wrote
// nothing and never will: no records (ErrEmptyBatch), an empty record
// (ErrEmptyRecord), a record over the maximum (ErrRecordTooLarge), a batch over the
// maximum (ErrBatchTooLarge), a closed shard or WAL (ErrClosed, wal.ErrClosed), a
// fenced owner or a lapsed lease (manifest.ErrFenced), a WAL that failed earlier,
// or a context done before the batch was committed. Once committed, the call waits
// for the sync even if ctx ends meanwhile, so a nil error always means durable.
func (s *Shard) Append(ctx context.Context, recs ...[]byte) (uint64, error) {
	start := s.cfg.Clock.Now()
	first, bytes, err := s.append(ctx, recs)
	s.cfg.Events.AppendEnded(len(recs), bytes, s.cfg.Clock.Now().Sub(start), err)
	return first, err
}

func (s *Shard) append(ctx context.Context, recs [][]byte) (first uint64, bytes int, err error) {
	bytes, err = s.check(recs)
	if err != nil {
		return 0, bytes, err
	}
	if err := ctx.Err(); err != nil {
		return 0, bytes, fmt.Errorf("shard %q: append: %w", s.id, err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return 0, bytes, fmt.Errorf("shard %q: append: %w", s.id, ErrClosed)
	}
	if err := s.cfg.Owner.Valid(); err != nil {
		return 0, bytes, fmt.Errorf("shard %q: append: %w", s.id, err)
	}
	first, err = s.cfg.Log.Append(ctx, s.id, s.epoch, recs)
	switch {
	case errors.Is(err, wal.ErrStaleEpoch):
		return 0, bytes, fmt.Errorf("shard %q: append: %w: %w", s.id, manifest.ErrFenced, err)
	case errors.Is(err, wal.ErrUnknownOutcome):
		return 0, bytes, fmt.Errorf("shard %q: append: %w: %w", s.id, ErrOutcomeUnknown, err)
	case err != nil:
		return 0, bytes, fmt.Errorf("shard %q: append: %w", s.id, err)
	}
	// The lease must still hold when the records became durable: an owner whose
	// lease ran out during the sync acknowledges nothing. The records stay in the
	// WAL, unacknowledged, like those of a crash before the reply; the error is not
	// ErrFenced, which promises nothing was written.
	if err := s.cfg.Owner.Valid(); err != nil {
		return 0, bytes, fmt.Errorf("shard %q: append at %d was durable after the lease ended (%v): %w", s.id, first, err, ErrOutcomeUnknown)
	}
	s.acknowledged(first + uint64(len(recs)))
	if s.cfg.SizeTrigger > 0 && s.cfg.Log.Info(s.id).UnsealedBytes >= s.cfg.SizeTrigger {
		s.cfg.Sealer.Kick()
	}
	return first, bytes, nil
}

// check validates a batch and returns its size in bytes.
func (s *Shard) check(recs [][]byte) (int, error) {
	if len(recs) == 0 {
		return 0, fmt.Errorf("shard %q: %w", s.id, ErrEmptyBatch)
	}
	if len(recs) > wal.MaxPageRecords {
		return 0, fmt.Errorf("shard %q: %d records, more than %d: %w", s.id, len(recs), wal.MaxPageRecords, ErrBatchTooLarge)
	}
	total := 0
	for i, r := range recs {
		switch {
		case len(r) == 0:
			return 0, fmt.Errorf("shard %q: record %d: %w", s.id, i, ErrEmptyRecord)
		case len(r) > s.cfg.MaxRecordSize:
			return 0, fmt.Errorf("shard %q: record %d is %d bytes, more than %d: %w", s.id, i, len(r), s.cfg.MaxRecordSize, ErrRecordTooLarge)
		}
		total += len(r)
	}
	if total > s.cfg.MaxBatchBytes {
		return 0, fmt.Errorf("shard %q: batch of %d bytes, more than %d: %w", s.id, total, s.cfg.MaxBatchBytes, ErrBatchTooLarge)
	}
	return total, nil
}

// acknowledged raises the end of the acknowledged records to end, and wakes the
// following reads. Appends of a shard are durable in offset order but may return
// out of it: the end is the largest acknowledged.
func (s *Shard) acknowledged(end uint64) {
	s.acked.Lock()
	defer s.acked.Unlock()
	if end <= s.acked.end {
		return
	}
	s.acked.end = end
	if s.acked.changed != nil {
		close(s.acked.changed)
		s.acked.changed = nil
	}
}

// watch returns the end of the acknowledged records, and a channel closed once
// it moves.
func (s *Shard) watch() (end uint64, changed <-chan struct{}) {
	s.acked.Lock()
	defer s.acked.Unlock()
	if s.acked.changed == nil {
		s.acked.changed = make(chan struct{})
	}
	return s.acked.end, s.acked.changed
}
