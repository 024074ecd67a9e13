package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/testclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func recs(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%d", prefix, i)
	}
	return out
}

// readAll returns the records of shard from offset from, checking density.
func readAll(t *testing.T, l *Log, shard string, from uint64) [][]byte {
	t.Helper()
	var out [][]byte
	next := from
	for p, err := range l.Pages(shard, from) {
		if err != nil {
			t.Fatalf("read %s from %d: %v", shard, from, err)
		}
		for i, r := range p.Records {
			off := p.FirstOffset + uint64(i)
			if off < from {
				continue
			}
			if off != next {
				t.Fatalf("offset %d after %d", off, next-1)
			}
			out = append(out, r)
			next++
		}
	}
	return out
}

func TestAppendAssignsDenseOffsetsAndReadsFromAnyOffset(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	ctx := t.Context()
	var want [][]byte
	for i, n := range []int{3, 1, 5} {
		batch := recs(fmt.Sprintf("b%d", i), n)
		first, err := l.Append(ctx, "s", 0, batch)
		if err != nil {
			t.Fatal(err)
		}
		if first != uint64(len(want)) {
			t.Fatalf("batch %d starts at %d, want %d", i, first, len(want))
		}
		want = append(want, batch...)
	}
	for from := range uint64(len(want) + 2) {
		got := readAll(t, l, "s", from)
		wantFrom := want[min(int(from), len(want)):]
		if len(got) != len(wantFrom) {
			t.Fatalf("from %d: %d records, want %d", from, len(got), len(wantFrom))
		}
		for i := range got {
			if !bytes.Equal(got[i], wantFrom[i]) {
				t.Fatalf("from %d, record %d: %q, want %q", from, i, got[i], wantFrom[i])
			}
		}
	}
	if got := readAll(t, l, "other", 0); len(got) != 0 {
		t.Fatalf("a shard never written has %d records", len(got))
	}
}

func TestStateSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	clk := testclock.New()
	l := open(t, dir, Options{Clock: clk})
	ctx := t.Context()
	l.Append(ctx, "a", 0, recs("a", 4))
	clk.Advance(time.Second)
	l.Append(ctx, "a", 0, [][]byte{[]byte("12345")})
	l.Append(ctx, "b", 0, recs("b", 2))
	before := l.Info("a")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{})
	defer l.Close()
	after := l.Info("a")
	if after != before || after.Next != 5 || after.Pages != 2 || after.UnsealedBytes != 4*3+5 || !after.Oldest.Equal(testclock.New().Now()) {
		t.Fatalf("after reopen %+v, before %+v", after, before)
	}
	if got := l.Shards(); fmt.Sprint(got) != "[a b]" {
		t.Fatalf("shards %v", got)
	}
	first, err := l.Append(ctx, "a", 0, recs("c", 1))
	if err != nil || first != 5 {
		t.Fatalf("append after reopen: %d, %v; want offset 5", first, err)
	}
}

func TestConcurrentAppendsStayDenseAndShareFsyncs(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	const shards, writers, appends = 4, 8, 25
	var wg sync.WaitGroup
	type ack struct {
		first uint64
		tag   string
	}
	acks := make(chan ack, shards*writers*appends)
	for s := range shards {
		for w := range writers {
			wg.Go(func() {
				for i := range appends {
					tag := fmt.Sprintf("w%d-%d", w, i)
					first, err := l.Append(t.Context(), fmt.Sprintf("s%d", s), 0, recs(tag, 3))
					if err != nil {
						t.Error(err)
						return
					}
					acks <- ack{first, fmt.Sprintf("s%d/%s", s, tag)}
				}
			})
		}
	}
	wg.Wait()
	close(acks)
	// Every acknowledged batch is where its offset says, whole and in order.
	records := map[string][][]byte{}
	for s := range shards {
		shard := fmt.Sprintf("s%d", s)
		records[shard] = readAll(t, l, shard, 0)
		if len(records[shard]) != writers*appends*3 {
			t.Fatalf("%s: %d records, want %d", shard, len(records[shard]), writers*appends*3)
		}
	}
	for a := range acks {
		shard, tag := a.tag[:2], a.tag[3:]
		for i := range 3 {
			if got, want := string(records[shard][a.first+uint64(i)]), fmt.Sprintf("%s-%d", tag, i); got != want {
				t.Fatalf("%s offset %d: %q, want %q", shard, a.first+uint64(i), got, want)
			}
		}
	}
	total := uint64(shards * writers * appends)
	if f := l.Fsyncs(); f == 0 || f >= total {
		t.Fatalf("%d fsyncs for %d concurrent appends: no group commit", f, total)
	} else {
		t.Logf("%d appends, %d fsyncs", total, f)
	}
}

func TestTruncateThroughAPageBoundary(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	ctx := t.Context()
	l.Append(ctx, "s", 0, recs("a", 3)) // 0..2
	l.Append(ctx, "s", 0, recs("b", 2)) // 3..4
	l.Append(ctx, "s", 0, recs("c", 4)) // 5..8
	if err := l.TruncateThrough("s", 0, 4); !errors.Is(err, ErrNotPageBoundary) {
		t.Fatalf("truncate inside a page: %v", err)
	}
	if err := l.TruncateThrough("s", 0, 5); err != nil {
		t.Fatal(err)
	}
	info := l.Info("s")
	if info.Floor != 5 || info.Pages != 1 || info.UnsealedBytes != 4*3 || info.Next != 9 {
		t.Fatalf("after truncate: %+v", info)
	}
	for _, err := range l.Pages("s", 2) {
		if !errors.Is(err, ErrTruncated) {
			t.Fatalf("read below the floor: %v", err)
		}
	}
	if got := readAll(t, l, "s", 5); len(got) != 4 || string(got[0]) != "c-0" {
		t.Fatalf("after truncate: %q", got)
	}
	// Truncating everything keeps the offsets going, across a reopen.
	if err := l.TruncateThrough("s", 0, 9); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = open(t, dir, Options{})
	defer l.Close()
	if info := l.Info("s"); info.Floor != 9 || info.Next != 9 || info.Pages != 0 || !info.Oldest.IsZero() {
		t.Fatalf("after truncating all and reopening: %+v", info)
	}
	if len(l.Shards()) != 0 {
		t.Fatalf("shards with pages: %v", l.Shards())
	}
	if first, err := l.Append(ctx, "s", 0, recs("d", 1)); err != nil || first != 9 {
		t.Fatalf("append after truncating all: %d, %v; want 9", first, err)
	}
}

func TestACorruptPageIsReportedWithItsPlace(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, l *Log){
		"flipped byte": func(t *testing.T, l *Log) {
			b := pageBytes(t, l, "s", 3)
			b[len(b)/2] ^= 0x40
			writePageBytes(t, l, "s", 3, b)
		},
		"page under another offset": func(t *testing.T, l *Log) {
			writePageBytes(t, l, "s", 3, pageBytes(t, l, "s", 0))
		},
		"last page missing": func(t *testing.T, l *Log) {
			writePageBytes(t, l, "s", 3, make([]byte, len(pageBytes(t, l, "s", 3))))
		},
	} {
		t.Run(name, func(t *testing.T) {
			l := open(t, t.TempDir(), Options{})
			defer l.Close()
			l.Append(t.Context(), "s", 0, recs("a", 3))
			l.Append(t.Context(), "s", 0, recs("b", 3))
			damage(t, l)
			var n int
			var got error
			for p, err := range l.Pages("s", 0) {
				if err != nil {
					got = err
					break
				}
				n += len(p.Records)
			}
			var ce *CorruptionError
			if !errors.As(got, &ce) || ce.Shard != "s" || ce.Offset != 3 || n != 3 {
				t.Fatalf("read %d records, then %v; want 3 records and a corruption at s/3", n, got)
			}
		})
	}
}

// pageRefAt returns where the shard's page at offset first is.
func pageRefAt(t *testing.T, l *Log, shard string, first uint64) pageRef {
	t.Helper()
	st := l.state(shard)
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, p := range st.mu.pages {
		if p.first == first {
			return p
		}
	}
	t.Fatalf("no page of %s at %d", shard, first)
	return pageRef{}
}

// pageBytes returns the bytes of the page's value in its segment.
func pageBytes(t *testing.T, l *Log, shard string, first uint64) []byte {
	t.Helper()
	r := pageRefAt(t, l, shard, first)
	klen := int64(len(pageKey(shard, first)))
	b := make([]byte, int64(r.n)-klen)
	if _, err := r.g.seg.r.ReadAt(b, r.g.base+int64(r.rel)+klen); err != nil {
		t.Fatal(err)
	}
	return b
}

// writePageBytes writes b over the page's value in its segment.
func writePageBytes(t *testing.T, l *Log, shard string, first uint64, b []byte) {
	t.Helper()
	r := pageRefAt(t, l, shard, first)
	f, err := l.fs.OpenReadWrite(r.g.seg.name, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, r.g.base+int64(r.rel)+int64(len(pageKey(shard, first)))); err != nil {
		t.Fatal(err)
	}
}

// rewriteSegments rewrites the closed log in dir without the entries drop returns
// true for, as a bug that lost them would leave it: every group re-framed, its
// checksums valid.
func rewriteSegments(t *testing.T, dir string, drop func(kind byte, body []byte) bool) {
	t.Helper()
	names, err := vfs.Default.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if _, ok := parseSegmentName(name); !ok {
			continue
		}
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out []byte
		for pos := 0; ; {
			h, ok := parseGroupHeader(data[pos:])
			if !ok {
				break
			}
			body := data[pos+groupHeaderLen : pos+groupHeaderLen+int(h.length)]
			var kept []byte
			for e := 0; e < len(body); {
				n := entryHeaderLen + int(binary.BigEndian.Uint32(body[e+1:]))
				if !drop(body[e], body[e+entryHeaderLen:e+n]) {
					kept = append(kept, body[e:e+n]...)
				}
				e += n
			}
			hb := make([]byte, groupHeaderLen)
			h.length = uint32(len(kept))
			putGroupHeader(hb, h)
			out = append(append(out, hb...), kept...)
			pos += groupHeaderLen + len(body)
			if h.flags&groupLast != 0 {
				break
			}
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// dropPages drops the shard's page entries from offset from to offset to.
func dropPages(shard string, from, to uint64) func(byte, []byte) bool {
	return func(kind byte, body []byte) bool {
		if kind != entryPage {
			return false
		}
		s, first, ok := splitPageKey(body)
		return ok && s == shard && first >= from && first < to
	}
}

func TestAMissingPageFailsTheOpen(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir, Options{})
	for range 3 {
		l.Append(t.Context(), "s", 0, recs("x", 2))
	}
	l.Close()
	rewriteSegments(t, dir, dropPages("s", 2, 3))
	_, err := Open(dir, Options{})
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.Offset != 4 {
		t.Fatalf("open with a hole: %v; want a corruption at offset 4", err)
	}
}

// A hole between a shard's floor and its first page is corruption too, after a
// truncation or without one (floor 0).
func TestAMissingFirstPageFailsTheOpen(t *testing.T) {
	for name, c := range map[string]struct {
		truncate uint64 // the floor, through TruncateThrough
		from, to uint64 // the pages deleted, as offsets
		report   uint64 // the page the error names
	}{
		"at offset 0":         {truncate: 0, from: 0, to: 2, report: 2},
		"at a raised floor":   {truncate: 2, from: 2, to: 4, report: 4},
		"and the second page": {truncate: 0, from: 0, to: 4, report: 4},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			l := open(t, dir, Options{})
			for range 3 {
				if _, err := l.Append(t.Context(), "s", 0, recs("x", 2)); err != nil {
					t.Fatal(err)
				}
			}
			if c.truncate > 0 {
				if err := l.TruncateThrough("s", 0, c.truncate); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			rewriteSegments(t, dir, dropPages("s", c.from, c.to))
			_, err := Open(dir, Options{})
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Shard != "s" || ce.Offset != c.report {
				t.Fatalf("open without the pages from %d to %d: %v; want a corruption of s at offset %d", c.from, c.to, err, c.report)
			}
		})
	}
}

func TestBadCallsChangeNothing(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	if _, err := l.Append(t.Context(), "s", 0, nil); err == nil {
		t.Fatal("empty batch accepted")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := l.Append(ctx, "s", 0, recs("x", 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled append: %v", err)
	}
	if info := l.Info("s"); info.Next != 0 || info.Pages != 0 {
		t.Fatalf("refused appends changed the shard: %+v", info)
	}
	l.Close()
	if _, err := l.Append(t.Context(), "s", 0, recs("x", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

// Truncations run beside appends to the same shard without holding its lock; the
// counts they leave must be the ones a reopen reads from disk, and the oldest page's
// time must be the first page's, also when appends land while a truncation counts.
func TestTruncationsBesideAppendsKeepTheCountsAReopenFinds(t *testing.T) {
	dir := t.TempDir()
	now := &ticking{Clock: clock.Real, at: time.Unix(1_700_000_000, 0)}
	l := open(t, dir, Options{Clock: now})
	ctx := t.Context()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.Append(ctx, "s", 0, recs(fmt.Sprintf("w%d-%d", w, i), 1+i%3)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for i := range 300 {
		info := l.Info("s")
		through := info.Next // the end of the log: appends may follow at once
		if i%2 == 1 {
			// Through the end of the first page instead.
			for p, err := range l.Pages("s", info.Floor) {
				if err != nil {
					t.Fatal(err)
				}
				through = p.NextOffset()
				break
			}
		}
		if err := l.TruncateThrough("s", 0, through); err != nil {
			t.Fatal(err)
		}
		info = l.Info("s")
		if info.Floor != through {
			t.Fatalf("floor %d after truncating through %d", info.Floor, through)
		}
		if info.Pages == 0 {
			continue
		}
		for p, err := range l.Pages("s", info.Floor) {
			if err != nil {
				t.Fatal(err)
			}
			if !p.AppendedAt.Equal(info.Oldest) {
				t.Fatalf("truncation %d: oldest %v, the first page was appended at %v", i, info.Oldest, p.AppendedAt)
			}
			break
		}
	}
	close(stop)
	wg.Wait()
	before := l.Info("s")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, dir, Options{Clock: now})
	defer l.Close()
	after := l.Info("s")
	if before.Floor != after.Floor || before.Next != after.Next || before.Pages != after.Pages ||
		before.UnsealedBytes != after.UnsealedBytes || !before.Oldest.Equal(after.Oldest) {
		t.Fatalf("counts before the reopen %+v, after %+v", before, after)
	}
	if got := readAll(t, l, "s", after.Floor); uint64(len(got)) != after.Next-after.Floor {
		t.Fatalf("%d records from the floor %d, want %d", len(got), after.Floor, after.Next-after.Floor)
	}
}

// ticking is a clock that moves a millisecond at each reading.
type ticking struct {
	clock.Clock // timers
	mu          sync.Mutex
	at          time.Time
}

func (c *ticking) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(time.Millisecond)
	return c.at
}

// TestCommitsCountEachGroupItsBytesAndItsTime: the group-commit counters say how
// many groups were synced, at least the bytes appended, and time in the writes and
// the fsyncs.
func TestCommitsCountEachGroupItsBytesAndItsTime(t *testing.T) {
	l := open(t, t.TempDir(), Options{})
	defer l.Close()
	before := l.Commits()
	payload := 0
	for i := range 5 {
		rs := recs(fmt.Sprintf("c%d", i), 8)
		for _, r := range rs {
			payload += len(r)
		}
		if _, err := l.Append(t.Context(), "s", 0, rs); err != nil {
			t.Fatal(err)
		}
	}
	c := l.Commits()
	groups := c.Groups - before.Groups
	if groups < 5 || c.Groups != l.Fsyncs() {
		t.Fatalf("%d groups for 5 appends one after another, Fsyncs %d", groups, l.Fsyncs())
	}
	if c.Bytes-before.Bytes < uint64(payload) {
		t.Fatalf("%d bytes written for %d bytes of records", c.Bytes-before.Bytes, payload)
	}
	if c.Write <= before.Write || c.Sync <= before.Sync {
		t.Fatalf("no time in the writes (%v) or the fsyncs (%v)", c.Write-before.Write, c.Sync-before.Sync)
	}
}
