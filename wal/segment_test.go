package wal

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// segmentFiles lists the segment files in dir, oldest first.
func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// TestASegmentIsDeletedOnlyWhenEveryPageInItIsSealed interleaves two shards over
// many small segments, seals one shard entirely and the other in part, and checks
// that a segment goes only once every page in it is sealed, and not while a reader
// holds it, and that whatever stays reads back after a reopen.
func TestASegmentIsDeletedOnlyWhenEveryPageInItIsSealed(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 8 << 10, RecycleSegments: -1}
	l := open(t, dir, opts)
	ctx := t.Context()
	big := strings.Repeat("x", 900)
	var ends []uint64 // b's next offset after each round
	for i := range 60 {
		if _, err := l.Append(ctx, "a", 0, [][]byte{[]byte(big)}); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // b is slower: its pages spread over every segment
			if _, err := l.Append(ctx, "b", 0, [][]byte{[]byte(big)}); err != nil {
				t.Fatal(err)
			}
		}
		ends = append(ends, l.Info("b").Next)
	}
	before := len(segmentFiles(t, dir))
	if before < 6 {
		t.Fatalf("%d segments, want several", before)
	}

	// All of a sealed: every segment still holds a page of b.
	if err := l.TruncateThrough("a", 0, l.Info("a").Next); err != nil {
		t.Fatal(err)
	}
	if got := len(segmentFiles(t, dir)); got != before {
		t.Fatalf("%d segments after sealing a, want all %d: each holds a page of b", got, before)
	}

	// A reader holds the segments of the pages it took.
	var read int
	for p, err := range l.Pages("b", 0) {
		if err != nil {
			t.Fatal(err)
		}
		if read == 0 {
			if err := l.TruncateThrough("b", 0, ends[29]); err != nil {
				t.Fatal(err)
			}
			if live, _ := l.Segments(); live != before {
				t.Fatalf("%d segments live while a reader holds all %d", live, before)
			}
		}
		read += len(p.Records)
	}
	if read != int(ends[59]) {
		t.Fatalf("a read racing the seal read %d records, want %d", read, ends[59])
	}
	// Now the segments whose pages are all below ends[29] go, and only those: the
	// rest read back after a reopen.
	live, _ := l.Segments()
	if live >= before {
		t.Fatalf("%d segments live after the reader, want fewer than %d", live, before)
	}
	waitFor(t, func() bool { return len(segmentFiles(t, dir)) == live })
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, opts)
	defer l.Close()
	if got := readAll(t, l, "b", ends[29]); len(got) != int(ends[59]-ends[29]) {
		t.Fatalf("after the reopen b reads %d records from %d, want %d", len(got), ends[29], ends[59]-ends[29])
	}
	if info := l.Info("a"); info.Pages != 0 || info.Floor != 60 {
		t.Fatalf("a after the reopen: %+v, want no pages from 60", info)
	}
	t.Logf("%d segments; %d after sealing half of b", before, live)

	// Everything sealed: only the current segment stays.
	if err := l.TruncateThrough("b", 0, ends[59]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(segmentFiles(t, dir)) == 1 })
}

// TestATornSegmentTailIsDroppedAndDamageBeforeItIsReported: a group that a crash
// left half written at the end of the newest segment is dropped, and the log opens
// with every acknowledged record; the same damage with a synced group after it is
// reported with the segment and the byte it starts at.
func TestATornSegmentTailIsDroppedAndDamageBeforeItIsReported(t *testing.T) {
	write := func(t *testing.T) (dir, newest string, groups []int64) {
		dir = t.TempDir()
		l := open(t, dir, Options{})
		for range 5 {
			if _, err := l.Append(t.Context(), "s", 0, recs("r", 3)); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		files := segmentFiles(t, dir)
		newest = files[len(files)-1]
		data, err := os.ReadFile(newest)
		if err != nil {
			t.Fatal(err)
		}
		for pos := 0; ; {
			h, ok := parseGroupHeader(data[pos:])
			if !ok {
				break
			}
			groups = append(groups, int64(pos))
			pos += groupHeaderLen + int(h.length)
		}
		if len(groups) != 1+5 {
			t.Fatalf("%d groups, want the open's checkpoint and one per append", len(groups))
		}
		return dir, newest, groups
	}
	edit := func(t *testing.T, path string, f func([]byte) []byte) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, f(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("torn tail", func(t *testing.T) {
		for name, tear := range map[string]func(data []byte, last int64) []byte{
			// The next group's write landed in part: its header and half its body.
			"half a group": func(data []byte, last int64) []byte {
				g := nextGroup(t, data, last)
				return append(data, g[:len(g)/2]...)
			},
			// Its header did not land, but a later sector of it did.
			"a later sector only": func(data []byte, last int64) []byte {
				g := nextGroup(t, data, last)
				clear(g[:groupHeaderLen+4])
				return append(data, g...)
			},
		} {
			t.Run(name, func(t *testing.T) {
				dir, newest, groups := write(t)
				edit(t, newest, func(data []byte) []byte { return tear(data, groups[len(groups)-1]) })
				l := open(t, dir, Options{})
				if got := readAll(t, l, "s", 0); len(got) != 15 {
					t.Fatalf("read %d records after a torn tail, want the 15 acknowledged", len(got))
				}
				if _, err := l.Append(t.Context(), "s", 0, recs("after", 1)); err != nil {
					t.Fatal(err)
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				l = open(t, dir, Options{}) // the torn segment is closed, and not the newest now
				defer l.Close()
				if got := readAll(t, l, "s", 0); len(got) != 16 {
					t.Fatalf("read %d records after the second open, want 16", len(got))
				}
			})
		}
	})

	t.Run("damage before a synced group", func(t *testing.T) {
		for name, at := range map[string]func(groups []int64) int64{
			"in a group's header": func(groups []int64) int64 { return groups[2] + 10 },
			"in a group's page":   func(groups []int64) int64 { return groups[2] + groupHeaderLen + 20 },
		} {
			t.Run(name, func(t *testing.T) {
				dir, newest, groups := write(t)
				pos := at(groups)
				edit(t, newest, func(data []byte) []byte { data[pos] ^= 0x10; return data })
				_, err := Open(dir, Options{})
				var se *SegmentError
				if !errors.As(err, &se) || !errors.Is(err, ErrCorrupt) || se.Segment != newest || se.Offset != groups[2] {
					t.Fatalf("open: %v; want the damage reported in %s at byte %d", err, newest, groups[2])
				}
			})
		}
	})
}

// nextGroup returns a copy of the group at last in data, as the group after it: a
// write the log could have made next.
func nextGroup(t *testing.T, data []byte, last int64) []byte {
	t.Helper()
	h, ok := parseGroupHeader(data[last:])
	if !ok {
		t.Fatal("no group there")
	}
	g := slices.Clone(data[last : last+groupHeaderLen+int64(h.length)])
	h.seq++
	putGroupHeader(g, h)
	return g
}

// waitFor waits, for at most 10 s (a liveness bound), until cond holds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}
