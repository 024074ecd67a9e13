package wal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// crashOpen simulates a power loss of fs (only synced data and directory entries
// survive, plus pct percent of the rest) and opens the log of the copy.
func crashOpen(t *testing.T, fs *vfs.MemFS, pct int, seed uint64, opts Options) (*Log, *vfs.MemFS, error) {
	t.Helper()
	cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
	if pct > 0 {
		cfg.RNG = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	}
	c := fs.CrashClone(cfg)
	opts.FS = c
	l, err := Open("wal", opts)
	return l, c, err
}

// TestAnImportBelowTheAcknowledgedEndSurvivesACrash: Import replaces a shard's
// pages with fewer than it had acknowledged (the shard's new history ends before
// its old one). Its doc promises a crash leaves the old pages or the new ones.
// But the l0-acked file still says the old end, and Import, unlike Adopt without
// keep, does not lower it durably before the log drops below it: a power loss
// after the Import (its group synced) and before the watermark's next rewrite
// leaves a log the open refuses as corrupt.
func TestAnImportBelowTheAcknowledgedEndSurvivesACrash(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewCrashableMem()
	opts := Options{FS: fs, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	if err := l.SetEpoch("s", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, "s", 1, recs("old", 10)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil { // writes l0-acked: acked 10
		t.Fatal(err)
	}
	l = open(t, "wal", opts)
	defer l.Close()
	if err := l.SetEpoch("s", 2); err != nil {
		t.Fatal(err)
	}
	// Another machine's tail, from the manifest's sealed watermark 4: two records.
	if err := l.Import("s", 2, 4, 4, recs("new", 2)); err != nil {
		t.Fatal(err)
	}
	l2, _, err := crashOpen(t, fs, 0, 0, Options{AckedInterval: time.Hour})
	if err != nil {
		t.Fatalf("open after a crash that kept the Import's synced group: %v", err)
	}
	defer l2.Close()
	if got := readAll(t, l2, "s", 4); len(got) != 2 || string(got[0]) != "new-0" {
		t.Fatalf("after the crash: %q, want the imported records", got)
	}
}

// TestAnImportBelowTheFloorIsRefusedAndChangesNothing: an import whose sealed
// watermark is below the shard's floor would take the floor back, which the l0-acked
// file (and any reader) holds as lost truncations: like Adopt, Import refuses it as
// corruption, and a crash after it reopens the log as it was.
func TestAnImportBelowTheFloorIsRefusedAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewCrashableMem()
	opts := Options{FS: fs, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	if _, err := l.Append(ctx, "s", 0, recs("old", 10)); err != nil {
		t.Fatal(err)
	}
	if err := l.TruncateThrough("s", 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil { // l0-acked: floor 10, acked 10
		t.Fatal(err)
	}
	l = open(t, "wal", opts)
	defer l.Close()
	var ce *CorruptionError
	if err := l.Import("s", 0, 6, 6, recs("new", 8)); !errors.As(err, &ce) {
		t.Fatalf("an import below the floor: %v, want a CorruptionError", err)
	}
	if info := l.Info("s"); info.Floor != 10 || info.Next != 10 {
		t.Fatalf("after the refused import: %+v, want floor and next 10", info)
	}
	l2, _, err := crashOpen(t, fs, 0, 0, Options{AckedInterval: time.Hour})
	if err != nil {
		t.Fatalf("open after a crash: %v", err)
	}
	defer l2.Close()
	if info := l2.Info("s"); info.Floor != 10 || info.Next != 10 {
		t.Fatalf("after the crash: %+v, want floor and next 10", info)
	}
}

var _ = fmt.Sprint
