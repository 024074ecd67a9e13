package tests

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/l0store/l0/wal"
)

// TestFlippedBytesInTheWALAreReportedNeverReadAsOtherRecords writes acknowledged
// batches over many small segments, flips one byte at a time in the closed segments
// and in the newest, and reopens: the open or the read must fail, or every
// acknowledged record must read back exactly. A shorter history or a changed record
// without an error fails the test.
//
// A flipped byte in the newest segment's last group reads, at open, as the torn
// write a crash leaves; the Log's acknowledged watermark is what turns that into a
// reported corruption (DESIGN.md, "The acknowledged watermark").
func TestFlippedBytesInTheWALAreReportedNeverReadAsOtherRecords(t *testing.T) {
	src := t.TempDir()
	l, err := wal.Open(src, wal.Options{SegmentSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var want [][]byte
	for i := range 3000 {
		batch := [][]byte{fmt.Appendf(nil, "record %d %s", i, strings.Repeat("y", 300+i%700))}
		if _, err := l.Append(t.Context(), "s", 0, batch); err != nil {
			t.Fatal(err)
		}
		want = append(want, batch...)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	files, _ := filepath.Glob(filepath.Join(src, "*.log"))
	slices.Sort(files)
	rng := rand.New(rand.NewPCG(1, 2))
	flips := map[string]int{}
	reported := map[string]int{}
	for i, f := range files {
		kind := "closed"
		if i == len(files)-1 {
			kind = "newest"
		}
		data, err := os.ReadFile(f)
		if err != nil || len(data) == 0 {
			continue
		}
		for range 24 {
			pos := rng.IntN(len(data))
			dir := copyDir(t, src)
			damaged := bytes.Clone(data)
			damaged[pos] ^= 1 << rng.IntN(8)
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			flips[kind]++
			if readBackReportsOrMatches(t, dir, want, fmt.Sprintf("%s byte %d", filepath.Base(f), pos)) {
				reported[kind]++
			}
		}
	}
	if flips["closed"] == 0 || flips["newest"] == 0 {
		t.Fatalf("flips by kind %v: want closed segments and the newest", flips)
	}
	if reported["newest"] == 0 {
		t.Fatal("no flip in the newest segment was reported: the test did not reach its records")
	}
	for kind, n := range flips {
		t.Logf("%s: %d flips, %d reported as errors, %d harmless (all records intact)", kind, n, reported[kind], n-reported[kind])
	}
}

// readBackReportsOrMatches reports whether the damage surfaced as an error; it fails
// the test if records came back wrong or short without one.
func readBackReportsOrMatches(t *testing.T, dir string, want [][]byte, what string) bool {
	t.Helper()
	l, err := wal.Open(dir, wal.Options{SegmentSize: 256 << 10})
	if err != nil {
		return true
	}
	defer l.Close()
	var got [][]byte
	for p, err := range l.Pages("s", 0) {
		if err != nil {
			return true
		}
		got = append(got, p.Records...)
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d records read back without an error, want %d", what, len(got), len(want))
		return false
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("%s: record %d changed without an error", what, i)
			return false
		}
	}
	return false
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}
