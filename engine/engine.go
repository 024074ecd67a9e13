// Package engine is l0's entry point: the shards of one node over one shared WAL, and
// their metrics.
//
// Open an engine on a directory, open shards on it, append and read:
//
//	e, err := engine.Open(ctx, engine.Options{Dir: "/var/lib/l0"})
//	sh, err := e.OpenShard(ctx, "orders-7")
//	first, err := sh.Append(ctx, rec1, rec2) // durable on return; offsets first, first+1
//	for rec, err := range sh.Read(ctx, first) { ... }
//	err = e.Close() // closes the shards still open
//
// Appends to one shard are ordered; appends to different shards run in parallel and
// share the WAL's fsyncs.
package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

var (
	// ErrInvalidOptions reports Options that Validate refuses.
	ErrInvalidOptions = errors.New("engine: invalid options")
	// ErrClosed reports use of an Engine after Close.
	ErrClosed = errors.New("engine: closed")
	// ErrShardOpen reports an OpenShard of a shard that is already open.
	ErrShardOpen = errors.New("engine: shard already open")
)

// Engine is the shards of one node. It is safe for concurrent use.
type Engine struct {
	opts    Options
	log     *wal.Log
	metrics *metrics

	mu struct {
		sync.Mutex
		closed bool
		shards map[string]*shard.Shard
	}
}

// Open opens the engine in opts.Dir, creating the directory if needed, and recovers
// the WAL: every acknowledged record of every shard is there when Open returns.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	log, err := wal.Open(filepath.Join(opts.Dir, "wal"), wal.Options{Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{opts: opts, log: log}
	e.mu.shards = make(map[string]*shard.Shard)
	e.metrics = newMetrics(e)
	if err := e.metrics.register(opts.Registerer); err != nil {
		log.Close()
		return nil, err
	}
	return e, nil
}

// OpenShard opens shard id for appends and reads. Its offsets continue where the
// shard's last acknowledged record left them. The id must pass shard.ValidateID; a
// shard is open at most once per engine (ErrShardOpen) until its Close.
func (e *Engine) OpenShard(ctx context.Context, id string) (*shard.Shard, error) {
	if err := shard.ValidateID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nil, ErrClosed
	}
	if _, ok := e.mu.shards[id]; ok {
		return nil, fmt.Errorf("%w: %q", ErrShardOpen, id)
	}
	sh, err := shard.Open(id, shard.Config{
		Log:           e.log,
		MaxRecordSize: e.opts.MaxRecordSize,
		MaxBatchBytes: e.opts.MaxBatchBytes,
		Observer:      e.metrics,
		OnClose:       func() { e.forget(id) },
	})
	if err != nil {
		return nil, err
	}
	e.mu.shards[id] = sh
	return sh, nil
}

// forget drops a closed shard, so it can be opened again.
func (e *Engine) forget(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.mu.shards, id)
}

// openShards returns the shards open now.
func (e *Engine) openShards() []*shard.Shard {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*shard.Shard, 0, len(e.mu.shards))
	for _, sh := range e.mu.shards {
		out = append(out, sh)
	}
	return out
}

// Close closes every shard still open (each waits for its appends in flight), then
// the WAL, and unregisters the metrics. Later calls fail with ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.mu.closed = true
	e.mu.Unlock()

	var errs []error
	for _, sh := range e.openShards() {
		if err := sh.Close(); err != nil && !errors.Is(err, shard.ErrClosed) {
			errs = append(errs, err)
		}
	}
	e.metrics.unregister()
	if err := e.log.Close(); err != nil {
		errs = append(errs, fmt.Errorf("engine: %w", err))
	}
	return errors.Join(errs...)
}
