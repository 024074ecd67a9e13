package wal

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// readCountFS counts the reads of the files it opens for reading.
type readCountFS struct {
	vfs.FS
	reads *atomic.Int64
}

func (fs readCountFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return f, err
	}
	return readCountFile{File: f, reads: fs.reads}, nil
}

type readCountFile struct {
	vfs.File
	reads *atomic.Int64
}

func (f readCountFile) ReadAt(p []byte, off int64) (int, error) {
	f.reads.Add(1)
	return f.File.ReadAt(p, off)
}

// A shard appended to by one writer at a time has a page in every group; a read of
// it takes the pages a megabyte at a time, not one read each, and still yields
// each page as appended, checked, across segments and between other shards' pages.
func TestPagesAreReadInRunsAndEachComesBackAsAppended(t *testing.T) {
	var reads atomic.Int64
	l := open(t, t.TempDir(), Options{FS: readCountFS{FS: vfs.Default, reads: &reads}, SegmentSize: 64 << 10})
	defer l.Close()
	ctx := t.Context()
	rec := func(shard string, i int) []byte {
		return bytes.Repeat(fmt.Appendf(nil, "%s-%d.", shard, i), 100) // about 600 bytes
	}
	// 200 pages of one shard, each synced before the next: one a group.
	for i := range 200 {
		if _, err := l.Append(ctx, "solo", 0, [][]byte{rec("solo", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Two shards appended to at once: their pages share groups.
	var wg sync.WaitGroup
	for _, s := range []string{"x", "y"} {
		wg.Go(func() {
			for i := range 200 {
				if _, err := l.Append(ctx, s, 0, [][]byte{rec(s, i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if live, _ := l.Segments(); live < 2 {
		t.Fatalf("%d segments: the test means pages across segments", live)
	}

	check := func(shard string, from int, aliased bool) {
		t.Helper()
		pages := l.Pages
		if aliased {
			pages = l.PagesAliased
		}
		next := from
		var kept [][]byte
		for p, err := range pages(shard, uint64(from)) {
			if err != nil {
				t.Fatalf("%s from %d: %v", shard, from, err)
			}
			for i, r := range p.Records {
				off := int(p.FirstOffset) + i
				if off < from {
					continue
				}
				if off != next || !bytes.Equal(r, rec(shard, off)) {
					t.Fatalf("%s from %d: record %d is %.20q, want record %d", shard, from, off, r, next)
				}
				kept = append(kept, r)
				next++
			}
		}
		if next != 200 {
			t.Fatalf("%s from %d: read to %d, want 200", shard, from, next)
		}
		if !aliased {
			for i, r := range kept { // each page keeps its own bytes
				if !bytes.Equal(r, rec(shard, from+i)) {
					t.Fatalf("%s from %d: kept record %d changed to %.20q", shard, from, from+i, r)
				}
			}
		}
	}
	for _, shard := range []string{"solo", "x", "y"} {
		for _, from := range []int{0, 1, 99, 199} {
			check(shard, from, false)
			check(shard, from, true)
		}
	}

	reads.Store(0)
	check("solo", 0, true)
	// 200 pages of about 600 bytes over 64 KiB segments: a read per segment.
	if n, segs := reads.Load(), int64(200*620/(64<<10)+1); n > segs+1 {
		t.Fatalf("%d reads for 200 pages in about %d segments: each page read on its own?", n, segs)
	}
}

// A seal reads a shard's pages in runs; what it costs per megabyte beside zstd's
// 180 MB/s a core.

func BenchmarkReadOneShardWrittenAPageAGroup(b *testing.B) {
	l, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	batch := make([][]byte, 16)
	for i := range batch {
		batch[i] = bytes.Repeat([]byte{byte(i)}, 1024)
	}
	for range 1000 {
		if _, err := l.Append(b.Context(), "s", 0, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(1000 * 16 * 1024)
	for b.Loop() {
		for _, err := range l.PagesAliased("s", 0) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

// Extent is where a seal's read ends: at least one page, then whole pages until
// the budget is reached, never past the durable pages, never below the floor.
func TestExtentEndsAtThePageThatReachesTheBudget(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	ctx := t.Context()
	for i := range 10 { // pages of 2 records of 50 bytes: offsets 0, 2, 4, ...
		if _, err := l.Append(ctx, "s", 0, [][]byte{bytes.Repeat([]byte{'a'}, 50), bytes.Repeat([]byte{byte(i)}, 50)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		from, budget, next uint64
		cut                bool
	}{
		{0, 250, 6, true}, // 300 bytes reach 250
		{0, 300, 6, true}, // exactly the budget
		{0, 1, 2, true},   // at least one page
		{0, 0, 2, true},   // even with no budget
		{4, 1 << 40, 20, false},
		{18, 100, 20, false}, // the last page
		{20, 100, 20, false}, // nothing past the end
	} {
		next, cut, err := l.Extent("s", c.from, c.budget)
		if err != nil || next != c.next || cut != c.cut {
			t.Errorf("Extent from %d, budget %d: %d %v %v, want %d %v", c.from, c.budget, next, cut, err, c.next, c.cut)
		}
	}
	if next, cut, err := l.Extent("none", 0, 100); err != nil || next != 0 || cut {
		t.Errorf("a shard the log does not know: %d %v %v", next, cut, err)
	}
	if err := l.TruncateThrough("s", 0, 4); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Extent("s", 2, 100); !errors.Is(err, ErrTruncated) {
		t.Errorf("below the floor: %v", err)
	}
}
