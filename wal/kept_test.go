package wal

import (
	"bytes"
	"fmt"
	"sync"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pages (the cloning read) says its records alias nothing the Log reuses, and
// shard.Read passes them on as "the caller's to keep": a caller may append to a
// record it kept (a newline, a suffix) without touching any other record it was
// given, though pages are read in runs that share one read's memory.
func TestAppendingToAKeptRecordLeavesTheOtherPagesAlone(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	ctx := t.Context()
	for i := range 10 {
		if _, err := l.Append(ctx, "s", 0, [][]byte{fmt.Appendf(nil, "record-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}

	// 1. Kept records: appending to the first changes the second.
	var kept [][]byte
	for p, err := range l.Pages("s", 0) {
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, p.Records...)
	}
	_ = append(kept[0], bytes.Repeat([]byte{'!'}, 200)...) // kept[0] is the caller's
	for i, r := range kept {
		if want := fmt.Sprintf("record-%d", i); string(r) != want {
			t.Errorf("after appending to kept record 0, kept record %d is %q, want %q (cap of record 0: %d)", i, r, want, cap(kept[0]))
			break
		}
	}

	// 2. During the iteration: a caller that appends to each record it is given
	// (say, a newline before printing it) makes the next page fail its checksum.
	var n int
	for p, err := range l.Pages("s", 0) {
		if err != nil {
			t.Fatalf("read of an intact log after %d pages, the caller appending to each record: %v", n, err)
		}
		for _, r := range p.Records {
			_ = append(r, bytes.Repeat([]byte{'\n'}, 100)...)
		}
		n++
	}
}

// Two shards share the segment; a kept record of one must not carry the other's
// bytes within its capacity (r[:cap(r)]).
func TestAKeptRecordCarriesNoOtherShardsBytes(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	ctx := t.Context()
	for i := range 4 {
		if _, err := l.Append(ctx, "tenant-a", 0, [][]byte{fmt.Appendf(nil, "a-%d", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, "tenant-b", 0, [][]byte{[]byte("SECRET-OF-B")}); err != nil {
			t.Fatal(err)
		}
	}
	for p, err := range l.Pages("tenant-a", 0) {
		if err != nil {
			t.Fatal(err)
		}
		r := p.Records[0]
		if bytes.Contains(r[:cap(r)], []byte("SECRET-OF-B")) {
			t.Fatalf("record %q of tenant-a holds tenant-b's record in its capacity (%d bytes)", r, cap(r))
		}
	}
}

// badFS fails every ReadAt that touches the bad bytes of one file: a sector the
// device can no longer read (EIO).
type badFS struct {
	vfs.FS
	mu       *sync.Mutex
	bad      map[string][2]int64 // file → [from, to)
	failures *int
}

func (fs badFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return f, err
	}
	return badFile{File: f, fs: fs, name: name}, nil
}

type badFile struct {
	vfs.File
	fs   badFS
	name string
}

func (f badFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	r, ok := f.fs.bad[f.name]
	f.fs.mu.Unlock()
	if ok && off < r[1] && off+int64(len(p)) > r[0] {
		f.fs.mu.Lock()
		*f.fs.failures++
		f.fs.mu.Unlock()
		return 0, syscall.EIO
	}
	return f.File.ReadAt(p, off)
}

// An unreadable sector under another shard's page, here one already sealed and
// truncated away, which nothing will read again, must not make this shard's intact
// pages unreadable, though a run of x's pages spans y's between them: a run whose
// read fails is read again page by page. Otherwise x's seal could never read it,
// and the segment, live with x's pages, would never be dropped.
func TestAnUnreadableSectorOfAnotherShardLeavesThisShardReadable(t *testing.T) {
	var mu sync.Mutex
	var failures int
	fs := badFS{FS: vfs.Default, mu: &mu, bad: map[string][2]int64{}, failures: &failures}
	l := open(t, t.TempDir(), Options{FS: fs})
	defer l.Close()
	ctx := t.Context()
	for i := range 4 {
		if _, err := l.Append(ctx, "x", 0, [][]byte{fmt.Appendf(nil, "x-%d", i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, "y", 0, [][]byte{fmt.Appendf(nil, "y-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// y is sealed through its end: its pages are gone from the log.
	if err := l.TruncateThrough("y", 0, 4); err != nil {
		t.Fatal(err)
	}
	// The sector under what was y's page at offset 1 goes bad. (Where that page
	// was: between x's pages 1 and 2, in the same segment.)
	x1, x2 := pageRefAt(t, l, "x", 1), pageRefAt(t, l, "x", 2)
	if x1.g.seg != x2.g.seg {
		t.Fatal("the test means x's pages 1 and 2 in one segment")
	}
	end1 := x1.g.base + int64(x1.rel) + int64(x1.n)
	start2 := x2.g.base + int64(x2.rel)
	mu.Lock()
	fs.bad[x1.g.seg.name] = [2]int64{end1 + 1, start2 - 1} // strictly between x's pages
	mu.Unlock()

	var got [][]byte
	for p, err := range l.Pages("x", 0) {
		if err != nil {
			t.Fatalf("read of x after %d records: %v (every byte of x's pages is readable; the bad bytes %d-%d are between them)", len(got), err, end1+1, start2-1)
		}
		got = append(got, p.Records...)
	}
	if len(got) != 4 {
		t.Fatalf("read %d records of x, want 4", len(got))
	}
}
