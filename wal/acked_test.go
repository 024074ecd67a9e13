package wal

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"
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
		marks, err := readMarks(dir)
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
			if err := writeMarks(dir, map[string]mark{"s": m}); err != nil {
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
	if err := writeMarks(dir, map[string]mark{"s": {acked: 1}}); err != nil {
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
