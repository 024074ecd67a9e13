package wal

import (
	"context"
	"errors"
	"testing"
)

func TestAStaleEpochCanNeitherAppendNorTruncate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	l := open(t, dir, Options{})
	if err := l.SetEpoch("s", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "s", 1, recs("a", 3)); err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch("s", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "s", 1, recs("late", 1)); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("append by epoch 1 after epoch 2: %v, want ErrStaleEpoch", err)
	}
	if err := l.TruncateThrough("s", 1, 3); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("truncate by epoch 1 after epoch 2: %v, want ErrStaleEpoch", err)
	}
	if info := l.Info("s"); info.Next != 3 || info.Pages != 1 || info.Floor != 0 {
		t.Fatalf("stale calls changed the shard: %+v", info)
	}
	l.Close()
	l = open(t, dir, Options{})
	defer l.Close()
	if info := l.Info("s"); info.Epoch != 2 {
		t.Fatalf("epoch after reopen: %d, want 2", info.Epoch)
	}
}

func TestAdoptKeepsTheBacklogAboveTheSealedWatermark(t *testing.T) {
	ctx := context.Background()
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	for _, n := range []int{2, 3, 4} {
		if _, err := l.Append(ctx, "s", 0, recs("r", n)); err != nil {
			t.Fatal(err)
		}
	}
	l.SetEpoch("s", 7)
	if _, err := l.Adopt("s", 7, 3, true); !errors.Is(err, ErrNotPageBoundary) {
		t.Fatalf("adopt inside a page: %v, want ErrNotPageBoundary", err)
	}
	if n, err := l.Adopt("s", 7, 5, true); err != nil || n != 0 {
		t.Fatalf("adopt: %d stranded, %v", n, err)
	}
	if info := l.Info("s"); info.Floor != 5 || info.Next != 9 || info.Pages != 1 {
		t.Fatalf("after adopt: %+v", info)
	}
	var ce *CorruptionError
	if _, err := l.Adopt("s", 7, 4, true); !errors.As(err, &ce) {
		t.Fatalf("sealed below the floor: %v, want corruption", err)
	}
	if _, err := l.Adopt("s", 6, 9, true); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("adopt by a stale epoch: %v", err)
	}
	if _, err := l.Adopt("s", 7, 12, true); err != nil {
		t.Fatal(err)
	}
	if info := l.Info("s"); info.Floor != 12 || info.Next != 12 || info.Pages != 0 {
		t.Fatalf("sealed past the end: %+v, want floor and next at 12", info)
	}
}

// TestAdoptingASupersededBacklogDropsItAndReopensClean: the shard continues at the
// new owner's sealed watermark, below what this log had acknowledged, and the
// acknowledged watermark does not mistake that for lost data.
func TestAdoptingASupersededBacklogDropsItAndReopensClean(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	l := open(t, dir, Options{})
	l.SetEpoch("s", 1)
	if _, err := l.Append(ctx, "s", 1, recs("mine", 10)); err != nil {
		t.Fatal(err)
	}
	if err := l.TruncateThrough("s", 1, 10); err != nil { // floor 10, nothing left
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "s", 1, recs("stranded", 5)); err != nil {
		t.Fatal(err)
	}
	l.SetEpoch("s", 3)
	n, err := l.Adopt("s", 3, 12, false)
	if err != nil || n != 5 {
		t.Fatalf("adopt superseded: %d stranded (want the 5 records above the floor), %v", n, err)
	}
	if info := l.Info("s"); info.Floor != 12 || info.Next != 12 || info.Pages != 0 {
		t.Fatalf("after adopt: %+v", info)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{})
	defer l.Close()
	if first, err := l.Append(ctx, "s", 3, recs("new", 1)); err != nil || first != 12 {
		t.Fatalf("append after reopen: %d, %v", first, err)
	}
}

// TestAnEpochNeverGoesBack: an owner epoch below the shard's is refused, and leaves
// the shard at its epoch, in memory and after a reopen; the shard's own is set
// again. A takeover decides from the epoch whether the log's pages are its own.
func TestAnEpochNeverGoesBack(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	if err := l.SetEpoch("s", 4); err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch("s", 3); !errors.Is(err, ErrStaleEpoch) {
		l.Close()
		t.Fatalf("SetEpoch(3) after SetEpoch(4): %v, want ErrStaleEpoch; the shard is at epoch %d", err, l.Info("s").Epoch)
	}
	if err := l.SetEpoch("s", 4); err != nil {
		t.Fatalf("SetEpoch(4) again: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{})
	defer l.Close()
	if e := l.Info("s").Epoch; e != 4 {
		t.Fatalf("after a refused SetEpoch(3) and a reopen the shard is at epoch %d, want 4", e)
	}
}
