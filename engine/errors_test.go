package engine

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

// heldSyncs is a file system whose syncs of pebble's log block while held.
type heldSyncs struct {
	held    atomic.Bool
	waiting chan struct{} // a sync is blocked
	release chan struct{}
}

func newHeldSyncs() (*heldSyncs, vfs.FS) {
	h := &heldSyncs{waiting: make(chan struct{}, 1), release: make(chan struct{})}
	return h, errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		default:
			return nil
		}
		if strings.HasSuffix(op.Path, ".log") && h.held.Load() {
			select {
			case h.waiting <- struct{}{}:
			default:
			}
			<-h.release
		}
		return nil
	}))
}

// TestEveryAppendErrorSaysWhetherRecordsMayHaveBeenWritten: a refusal writes
// nothing, now or later, and is never ErrOutcomeUnknown; an append whose records
// reached the WAL but could not be acknowledged is ErrOutcomeUnknown and never
// ErrFenced, which a caller may retry on.
func TestEveryAppendErrorSaysWhetherRecordsMayHaveBeenWritten(t *testing.T) {
	ctx := context.Background()
	clk := testclock.New()
	held, fs := newHeldSyncs()
	dir := t.TempDir()
	opts := Options{Dir: dir, Clock: clk, FS: fs, MaxRecordSize: 100, MaxBatchBytes: 250, Seal: quietSealOptions()}
	e := open(t, opts)
	sh := openShard(t, e, "s")
	if _, err := sh.Append(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	refusals := badAppends(ctx)
	refused := func(t *testing.T, sh *shard.Shard, err, want error, next uint64) {
		t.Helper()
		if !errors.Is(err, want) || errors.Is(err, shard.ErrOutcomeUnknown) {
			t.Fatalf("Append: %v; want %v, a refusal", err, want)
		}
		if got := sh.Info().Next; got != next {
			t.Fatalf("next offset %d after a refusal, want %d", got, next)
		}
	}
	for name, tc := range refusals {
		t.Run(name, func(t *testing.T) {
			_, err := sh.Append(tc.ctx, tc.recs...)
			refused(t, sh, err, tc.want, 1)
		})
	}
	t.Run("lease lapsed before the commit", func(t *testing.T) {
		clk.Skip(e.opts.Lease.Duration)
		_, err := sh.Append(ctx, []byte("late"))
		refused(t, sh, err, ErrFenced, 1)
		if err := sh.Retire(ctx); err != nil && !errors.Is(err, ErrFenced) {
			t.Fatal(err)
		}
	})
	t.Run("closed shard", func(t *testing.T) {
		_, err := sh.Append(ctx, []byte("after"))
		refused(t, sh, err, shard.ErrClosed, 1)
	})

	// The lease runs out while the sync is in flight: the page is in the WAL, so
	// the records may become history; the caller must not take it as a refusal.
	// The reopened shard inherits the record appended first; its seal would
	// commit, and renew the lease, while the sync is held.
	e.sealer.Pause("s", true)
	sh = openShard(t, e, "s")
	held.held.Store(true)
	result := make(chan error, 1)
	go func() { _, err := sh.Append(ctx, []byte("maybe")); result <- err }()
	select {
	case <-held.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the append's sync never started")
	}
	clk.Skip(e.opts.Lease.Duration) // before the renewal that would save it
	held.held.Store(false)
	close(held.release)
	err := <-result
	if !errors.Is(err, shard.ErrOutcomeUnknown) || errors.Is(err, ErrFenced) {
		t.Fatalf("an append durable after its lease: %v; want ErrOutcomeUnknown and not ErrFenced", err)
	}
	if n := e.Metrics().AppendErrors[reasonUnknown]; n != 1 {
		t.Fatalf("%d appends counted with an unknown outcome, want 1", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// It did become history: the next owner on this Dir adopts it.
	opts.FS = nil
	e = open(t, opts)
	got := readAll(t, openShard(t, e, "s"), 0)
	if len(got) != 2 || string(got[0]) != "before" || string(got[1]) != "maybe" {
		t.Fatalf("after reopen: %q; want the accepted record and the one of unknown outcome", got)
	}
}

// TestAnAppendRefusedByAClosedWALCountsAsClosed: the reason label says what
// happened: a closed log is closed, not a WAL failure.
func TestAnAppendRefusedByAClosedWALCountsAsClosed(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	if err := e.log.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Append(context.Background(), []byte("x")); !errors.Is(err, wal.ErrClosed) || errors.Is(err, shard.ErrOutcomeUnknown) {
		t.Fatalf("append to a closed WAL: %v, want wal.ErrClosed, a refusal", err)
	}
	if m := e.Metrics(); m.AppendErrors[reasonClosed] != 1 || m.AppendErrors[reasonWAL] != 0 {
		t.Fatalf("append errors %v, want one closed", m.AppendErrors)
	}
}
