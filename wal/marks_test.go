package wal

import (
	"context"
	"errors"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
)

// damageNewestGroup flips a bit in the body of the last group of dir's newest segment,
// durably: media damage that reads, at open, as the torn write a crash leaves.
func damageNewestGroup(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var newest string
	for _, n := range names {
		if _, ok := parseSegmentName(n); ok && n > newest {
			newest = n
		}
	}
	path := fs.PathJoin(dir, newest)
	data, err := fsutil.ReadFile(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for pos := 0; ; {
		h, ok := parseGroupHeader(data[pos:])
		if !ok {
			break
		}
		last = pos
		pos += groupHeaderLen + int(h.length)
		if h.flags&groupLast != 0 {
			break
		}
	}
	if last < 0 {
		t.Fatalf("no group in the newest segment, %s", newest)
	}
	at := int64(last + groupHeaderLen + 2)
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{data[at] ^ 0x40}, at); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestDamageAfterACleanCloseCannotUndoAnEpoch: a SetEpoch whose group is the last
// before a clean Close, damaged, reads as a torn tail. The watermark holds the
// epoch, so the open reports the damage instead of going back to the earlier epoch,
// from which a takeover would take another owner's pages for its own.
func TestDamageAfterACleanCloseCannotUndoAnEpoch(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{FS: fs, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	if err := l.SetEpoch("s", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(context.Background(), "s", 3, recs("r", 4)); err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch("s", 4); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	damageNewestGroup(t, fs, "wal")
	l, err := Open("wal", opts)
	if err == nil {
		e := l.Info("s").Epoch
		l.Close()
		t.Fatalf("after a clean Close and damage to the last group, the open succeeds with shard s at epoch %d, the acknowledged SetEpoch(4) gone", e)
	}
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Shard != "s" {
		t.Fatalf("open: %v, want a CorruptionError of shard s", err)
	}
}

// TestDamageAfterACleanCloseCannotUndoAReset: an adoption of a superseded backlog
// drops the shard's pages with a reset; its group, the last before a clean Close,
// damaged, reads as a torn tail. The watermark names the reset's group, so the open
// reports the damage instead of bringing the dropped pages back.
func TestDamageAfterACleanCloseCannotUndoAReset(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{FS: fs, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	if _, err := l.Append(context.Background(), "s", 0, recs("superseded", 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Adopt("s", 0, 0, false); err != nil {
		t.Fatal(err)
	}
	if info := l.Info("s"); info.Next != 0 || info.Pages != 0 {
		t.Fatalf("after the adoption: %+v", info)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	damageNewestGroup(t, fs, "wal")
	l, err := Open("wal", opts)
	if err == nil {
		got := readAll(t, l, "s", l.Info("s").Floor)
		l.Close()
		first := ""
		if len(got) > 0 {
			first = string(got[0])
		}
		t.Fatalf("after a clean Close and damage to the last group, the open succeeds with the dropped pages back: %d records, the first %q", len(got), first)
	}
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Shard != "s" {
		t.Fatalf("open: %v, want a CorruptionError of shard s", err)
	}
}

// TestTheOpenClaimsTheEpochAndResetItRecovered: a kill before the watermark caught
// up leaves it behind the log, or without it. The open writes into it the epoch and
// the reset it replayed, as it does records and floors, so that damage to their
// groups after it is reported too.
func TestTheOpenClaimsTheEpochAndResetItRecovered(t *testing.T) {
	for name, stale := range map[string]map[string]mark{
		"no watermark file":        nil,
		"a watermark without them": {"s": {floor: 2, acked: 3}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{AckedInterval: time.Hour}
			l := open(t, dir, opts)
			ctx := context.Background()
			if err := l.SetEpoch("s", 2); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Append(ctx, "s", 2, recs("superseded", 4)); err != nil {
				t.Fatal(err)
			}
			if err := l.Import("s", 2, 2, 2, recs("imported", 1)); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			want, err := readMarks(vfs.Default, dir)
			if err != nil {
				t.Fatal(err)
			}
			if m := want["s"]; m.epoch != 2 || m.reset == 0 || m.floor != 2 || m.acked != 3 {
				t.Fatalf("after a clean Close the watermark holds %+v, want floor 2, acked 3, epoch 2 and a reset", m)
			}
			// Stand in for a kill before the watermark caught up.
			if stale == nil {
				if err := os.Remove(dir + "/" + ackedFile); err != nil {
					t.Fatal(err)
				}
			} else if err := writeMarks(vfs.Default, dir, stale); err != nil {
				t.Fatal(err)
			}
			l = open(t, dir, opts)
			defer l.Close()
			if got, err := readMarks(vfs.Default, dir); err != nil || !maps.Equal(got, want) {
				t.Fatalf("after an open that recovered shard s at epoch 2 with its reset in group %d, the watermark holds %+v (%v); want %+v",
					want["s"].reset, got, err, want)
			}
		})
	}
}

// TestAWatermarkOfTheFirstFormatStillOpens: a log whose l0-acked file is of the
// first format, which has floors and acknowledged ends only, opens and is held to
// them; the open then claims the epoch it recovered, in the current format.
func TestAWatermarkOfTheFirstFormatStillOpens(t *testing.T) {
	v1, err := os.ReadFile("testdata/l0-acked-v1")
	if err != nil {
		t.Fatal(err)
	}
	if v1[len(ackedMagic)] != ackedVersion1 {
		t.Fatalf("the fixture is of version %d, want %d", v1[len(ackedMagic)], ackedVersion1)
	}
	marks, err := decodeMarks(v1)
	if want := map[string]mark{"s": {floor: 2, acked: 5}, "t": {acked: 1}}; err != nil || !maps.Equal(marks, want) {
		t.Fatalf("the first format's fixture decodes to %v, %v; want %v", marks, err, want)
	}
	for name, short := range map[string]bool{"the log it covers": false, "a log short of it": true} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			l := open(t, dir, Options{})
			ctx := context.Background()
			if err := l.SetEpoch("s", 1); err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{2, 3} {
				if _, err := l.Append(ctx, "s", 1, recs("r", n)); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.TruncateThrough("s", 1, 2); err != nil {
				t.Fatal(err)
			}
			if !short {
				if _, err := l.Append(ctx, "t", 0, recs("r", 1)); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dir+"/"+ackedFile, v1, 0o644); err != nil {
				t.Fatal(err)
			}
			l, err := Open(dir, Options{})
			if short {
				var ce *CorruptionError
				if err == nil {
					l.Close()
				}
				if !errors.As(err, &ce) || ce.Shard != "t" {
					t.Fatalf("open of a log without the record of t the watermark of the first format acknowledges: %v, want a CorruptionError of shard t", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("open with a watermark of the first format: %v", err)
			}
			defer l.Close()
			if got := readAll(t, l, "s", 2); len(got) != 3 {
				t.Fatalf("%d records of s from 2, want 3", len(got))
			}
			b, err := os.ReadFile(dir + "/" + ackedFile)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeMarks(b)
			want := map[string]mark{"s": {floor: 2, acked: 5, epoch: 1}, "t": {acked: 1}}
			if err != nil || b[len(ackedMagic)] != ackedVersion || !maps.Equal(got, want) {
				t.Fatalf("after the open the watermark is of version %d and holds %v (%v); want version %d holding %v",
					b[len(ackedMagic)], got, err, ackedVersion, want)
			}
		})
	}
}

// TestTheWatermarkHoldsAnEpochOnceSetEpochReturns: SetEpoch claims its epoch in the
// watermark before it returns, not at the next interval: damage to its group after a
// crash, not only after a clean Close, is reported.
func TestTheWatermarkHoldsAnEpochOnceSetEpochReturns(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{AckedInterval: time.Hour})
	defer l.Close()
	for _, e := range []uint64{3, 4} {
		if err := l.SetEpoch("s", e); err != nil {
			t.Fatal(err)
		}
		if marks, err := readMarks(vfs.Default, dir); err != nil || marks["s"].epoch != e {
			t.Fatalf("once SetEpoch(%d) returned the watermark holds %+v (%v), without the epoch", e, marks["s"], err)
		}
	}
}
