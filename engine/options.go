package engine

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits on Options. A batch is one WAL page, written as one pebble batch: keeping it
// well under pebble's memtable keeps every append on the ordinary commit path.
const (
	DefaultMaxRecordSize = 1 << 20
	DefaultMaxBatchBytes = 4 << 20
	MaxBatchBytesLimit   = 64 << 20
)

// Options configure an Engine. The zero value of every field but Dir is valid and
// means the default that the field documents.
type Options struct {
	// Dir holds the engine's local state: the WAL in Dir/wal. Required. One engine
	// at a time may use a Dir; a second Open fails while the first is open.
	Dir string
	// Registerer receives the engine's l0_ metrics; nil registers nothing (Metrics
	// still works). The collectors are unregistered at Close, so engines opened one
	// after another may share a Registerer; engines open at the same time need
	// their own, or one wrapped with prometheus.WrapRegistererWith.
	Registerer prometheus.Registerer
	// Logger receives the engine's and pebble's messages; nil discards them. Nothing
	// is logged on the append path.
	Logger *slog.Logger
	// MaxRecordSize is the largest record Append accepts, in bytes. Default 1 MiB.
	MaxRecordSize int
	// MaxBatchBytes is the largest sum of record sizes one Append accepts. Default
	// 4 MiB, at most 64 MiB, and at least MaxRecordSize.
	MaxBatchBytes int
}

// EnsureDefaults fills in the zero fields.
func (o *Options) EnsureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxRecordSize == 0 {
		o.MaxRecordSize = DefaultMaxRecordSize
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = max(DefaultMaxBatchBytes, o.MaxRecordSize)
	}
}

// Validate reports the first invalid field of defaulted options as an error wrapping
// ErrInvalidOptions.
func (o *Options) Validate() error {
	switch {
	case o.Dir == "":
		return fmt.Errorf("%w: Dir is required", ErrInvalidOptions)
	case o.MaxRecordSize <= 0:
		return fmt.Errorf("%w: MaxRecordSize %d", ErrInvalidOptions, o.MaxRecordSize)
	case o.MaxBatchBytes <= 0 || o.MaxBatchBytes > MaxBatchBytesLimit:
		return fmt.Errorf("%w: MaxBatchBytes %d, want 1 to %d", ErrInvalidOptions, o.MaxBatchBytes, MaxBatchBytesLimit)
	case o.MaxRecordSize > o.MaxBatchBytes:
		return fmt.Errorf("%w: MaxRecordSize %d over MaxBatchBytes %d", ErrInvalidOptions, o.MaxRecordSize, o.MaxBatchBytes)
	}
	return nil
}
