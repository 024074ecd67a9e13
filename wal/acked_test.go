package wal

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestWatermarkEncodingRoundTripsAndRefusesDamage(t *testing.T) {
	marks := map[string]mark{"a": {floor: 0, acked: 7}, "orders-7": {floor: 100, acked: 1 << 40}}
	b := encodeMarks(marks)
	got, err := decodeMarks(b)
	if err != nil || !maps.Equal(got, marks) {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for n := range len(b) {
		if _, err := decodeMarks(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
		}
	}
	for i := range len(b) * 8 {
		d := append([]byte(nil), b...)
		d[i/8] ^= 1 << (i % 8)
		if _, err := decodeMarks(d); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("bit %d flipped: %v, want ErrCorrupt", i, err)
		}
	}
}

func TestTheWatermarkFollowsAppendsWhileTheLogIsOpen(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{AckedInterval: 5 * time.Millisecond})
	defer l.Close()
	if _, err := l.Append(context.Background(), "s", 0, recs("r", 3)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		marks, err := readMarks(vfs.Default, dir)
		if err == nil && marks["s"].acked == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watermark %v (%v) 5 s after an acknowledged append", marks, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestALogThatReplaysShortOfTheWatermarkFailsTheOpen stands in for pebble dropping
// the synced tail of its last log: the watermark says more was acknowledged, or
// truncated, than the log replays.
func TestALogThatReplaysShortOfTheWatermarkFailsTheOpen(t *testing.T) {
	for name, m := range map[string]mark{
		"records missing": {floor: 0, acked: 4},
		"truncation lost": {floor: 3, acked: 3},
		"shard vanished":  {floor: 0, acked: 1},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			l := open(t, dir, Options{})
			shard := "s"
			if name == "shard vanished" {
				shard = "other"
			}
			if _, err := l.Append(context.Background(), shard, 0, recs("r", 3)); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := writeMarks(vfs.Default, dir, map[string]mark{"s": m}); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir, Options{})
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Shard != "s" {
				t.Fatalf("open: %v, want a CorruptionError of shard s", err)
			}
		})
	}
}

func TestAWatermarkBehindTheLogIsFine(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	l.Append(context.Background(), "s", 0, recs("r", 3))
	l.Close()
	// An older watermark is what a crash before its rewrite leaves.
	if err := writeMarks(vfs.Default, dir, map[string]mark{"s": {acked: 1}}); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{})
	defer l.Close()
	if got := readAll(t, l, "s", 0); len(got) != 3 {
		t.Fatalf("%d records, want 3", len(got))
	}
}

func TestADamagedWatermarkFailsTheOpen(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	l.Append(context.Background(), "s", 0, recs("r", 3))
	l.Close()
	path := filepath.Join(dir, ackedFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	os.WriteFile(path, b, 0o644)
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open: %v, want ErrCorrupt", err)
	}
}

// A kill before the watermark caught up leaves it behind the log. The open that
// recovers the log must bring it up to what it replayed, durably, so that a clean
// Close with nothing appended since does not leave those records uncovered.
func TestACleanCloseAfterRecoveryRewritesTheWatermark(t *testing.T) {
	for name, stale := range map[string]map[string]mark{
		"records past the watermark":  {"s": {floor: 0, acked: 1}},
		"a truncation past it":        {"s": {floor: 0, acked: 3}},
		"a shard the watermark lacks": {"other": {floor: 0, acked: 1}},
		"no watermark file":           nil,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{AckedInterval: time.Hour} // only the open and Close write it
			l := open(t, dir, opts)
			ctx := context.Background()
			for _, shard := range []string{"s", "other"} {
				for _, n := range []int{2, 1} {
					if _, err := l.Append(ctx, shard, 0, recs("r", n)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := l.TruncateThrough("s", 0, 2); err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			want := map[string]mark{"s": {floor: 2, acked: 3}, "other": {floor: 0, acked: 3}}
			if got, err := readMarks(vfs.Default, dir); err != nil || !maps.Equal(got, want) {
				t.Fatalf("after the first Close: %v, %v; want %v", got, err, want)
			}
			// Stand in for a kill before the watermark caught up.
			if stale == nil {
				if err := os.Remove(filepath.Join(dir, ackedFile)); err != nil {
					t.Fatal(err)
				}
			} else if err := writeMarks(vfs.Default, dir, stale); err != nil {
				t.Fatal(err)
			}
			l = open(t, dir, opts)
			if got, err := readMarks(vfs.Default, dir); err != nil || !maps.Equal(got, want) {
				l.Close()
				t.Fatalf("after the recovering open: %v, %v; want %v", got, err, want)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := readMarks(vfs.Default, dir); err != nil || !maps.Equal(got, want) {
				t.Fatalf("after a clean Close: %v, %v; want %v", got, err, want)
			}
		})
	}
}
