package shard

import (
	"context"
	"fmt"
	"iter"
)

// Record is one record and its offset.
type Record struct {
	Offset uint64
	Value  []byte
}

// Read iterates over the shard's records from offset from, in offset order, as they
// were when the iteration started. Values are the caller's to keep. A from past the
// last record yields nothing; a from below what the shard still holds is an error
// wrapping wal.ErrTruncated; corruption ends the iteration with an error wrapping
// wal.ErrCorrupt, never with a record that was not appended.
func (s *Shard) Read(ctx context.Context, from uint64) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		s.mu.RLock()
		closed := s.mu.closed
		s.mu.RUnlock()
		if closed {
			yield(Record{}, fmt.Errorf("shard %q: read: %w", s.id, ErrClosed))
			return
		}
		for page, err := range s.cfg.Log.Pages(s.id, from) {
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				yield(Record{}, fmt.Errorf("shard %q: read from %d: %w", s.id, from, err))
				return
			}
			for i, v := range page.Records {
				off := page.FirstOffset + uint64(i)
				if off < from {
					continue
				}
				if !yield(Record{Offset: off, Value: v}, nil) {
					return
				}
			}
		}
	}
}
