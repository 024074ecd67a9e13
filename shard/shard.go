// Package shard is one shard of an engine: the append and read path over the engine's
// shared WAL. A Shard is opened by the engine (engine.OpenShard), which owns the WAL
// and the metrics; this package holds what is specific to one shard.
//
// Records get dense offsets, starting at 0 for a new shard and continuing across
// reopens. Empty records are refused (ErrEmptyRecord): a zero-length record cannot
// be told from a missing payload by most consumers of an event log, so an
// application that means "no payload" should say so in its own encoding.
package shard

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/l0store/l0/wal"
)

var (
	// ErrInvalidID reports a shard id that ValidateID refuses.
	ErrInvalidID = errors.New("shard: invalid id")
	// ErrEmptyBatch reports an append of no records.
	ErrEmptyBatch = errors.New("shard: empty batch")
	// ErrEmptyRecord reports a record of zero bytes.
	ErrEmptyRecord = errors.New("shard: empty record")
	// ErrRecordTooLarge reports a record over Config.MaxRecordSize.
	ErrRecordTooLarge = errors.New("shard: record too large")
	// ErrBatchTooLarge reports a batch over Config.MaxBatchBytes or with more records
	// than a page holds.
	ErrBatchTooLarge = errors.New("shard: batch too large")
	// ErrClosed reports use of a Shard after Close, or after its engine closed.
	ErrClosed = errors.New("shard: closed")
)

// Observer is told of every append; the engine counts them. Implementations must be
// cheap and safe for concurrent use: they run on the append path.
type Observer interface {
	// ObserveAppend reports one call to Append: its records and bytes, how long it
	// took, and its error (nil once the records are durable).
	ObserveAppend(records, bytes int, took time.Duration, err error)
}

// Config is what the engine gives a shard. Every field is required.
type Config struct {
	Log           *wal.Log
	MaxRecordSize int
	MaxBatchBytes int
	Observer      Observer
	// OnClose runs once, when the shard has closed.
	OnClose func()
}

// Shard is one open shard. It is safe for concurrent use.
type Shard struct {
	id  string
	cfg Config

	// mu is held for reading by every append for its whole duration, so Close, which
	// takes it for writing, stops intake and waits for the appends in flight.
	mu struct {
		sync.RWMutex
		closed bool
	}
}

// Open opens shard id on the WAL. The id must pass ValidateID.
func Open(id string, cfg Config) (*Shard, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	if cfg.Log == nil || cfg.Observer == nil || cfg.OnClose == nil || cfg.MaxRecordSize <= 0 || cfg.MaxBatchBytes <= 0 {
		return nil, fmt.Errorf("shard %q: incomplete config", id)
	}
	return &Shard{id: id, cfg: cfg}, nil
}

// ID returns the shard's id.
func (s *Shard) ID() string { return s.id }

// Info is what a shard knows of itself without reading its records.
type Info struct {
	// Next is the offset the next appended record gets.
	Next uint64
	// UnsealedBytes is the size of the records not yet sealed, and Oldest when the
	// oldest of them was appended (zero when there are none).
	UnsealedBytes uint64
	Oldest        time.Time
}

// Info returns the shard's state.
func (s *Shard) Info() Info {
	wi := s.cfg.Log.Info(s.id)
	return Info{Next: wi.Next, UnsealedBytes: wi.UnsealedBytes, Oldest: wi.Oldest}
}

// Close stops intake, waits for the appends in flight, and closes the shard. Later
// calls fail with ErrClosed; closing twice returns ErrClosed.
func (s *Shard) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("shard %q: %w", s.id, ErrClosed)
	}
	s.mu.closed = true
	s.cfg.OnClose()
	return nil
}
