package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/wal"
)

// Append writes recs as one batch and returns the offset of the first record once
// the batch is durable; the others follow at first+1, first+2, ... Appends to one
// shard are ordered; the batch is all or nothing.
//
// A refused batch writes nothing: no records (ErrEmptyBatch), an empty record
// (ErrEmptyRecord), a record over the maximum (ErrRecordTooLarge), a batch over the
// maximum (ErrBatchTooLarge), a closed shard (ErrClosed), a fenced owner or a lapsed
// lease (manifest.ErrFenced), or a context done before the batch is committed. Once committed, the call waits for the sync even if ctx
// ends meanwhile, so a nil error always means durable and an error after the commit
// is the WAL's.
func (s *Shard) Append(ctx context.Context, recs ...[]byte) (uint64, error) {
	start := time.Now()
	first, bytes, err := s.append(ctx, recs)
	s.cfg.Observer.ObserveAppend(len(recs), bytes, time.Since(start), err)
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
	if errors.Is(err, wal.ErrStaleEpoch) {
		err = fmt.Errorf("%w: %w", manifest.ErrFenced, err)
	}
	if err != nil {
		return 0, bytes, fmt.Errorf("shard %q: append: %w", s.id, err)
	}
	// The lease must still hold when the records became durable: an owner whose
	// lease ran out during the sync acknowledges nothing. The records stay in the
	// WAL, unacknowledged, like those of a crash before the reply.
	if err := s.cfg.Owner.Valid(); err != nil {
		return 0, bytes, fmt.Errorf("shard %q: append at %d was durable after the lease: %w", s.id, first, err)
	}
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
