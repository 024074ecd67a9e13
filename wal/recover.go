package wal

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
)

// SegmentError says where a segment is damaged.
type SegmentError struct {
	Segment string // the file
	Offset  int64  // the byte the damage starts at
	Reason  string
}

func (e *SegmentError) Error() string {
	return fmt.Sprintf("wal: segment %s damaged at byte %d: %s", e.Segment, e.Offset, e.Reason)
}

func (e *SegmentError) Unwrap() error { return ErrCorrupt }

// replayed is what the segments say of one shard.
type replayed struct {
	epoch, floor uint64
	reset        uint64 // the sequence of the group holding the last reset, 0 for none
	pages        []pageRef
}

// replay rebuilds the shards' state from the segments, in log order.
type replay struct {
	shards map[string]*replayed
	first  uint64 // the first group's sequence
	seq    uint64 // the last group's
}

func (r *replay) shard(id string) *replayed {
	st, ok := r.shards[id]
	if !ok {
		st = &replayed{}
		r.shards[id] = st
	}
	return st
}

// raise lifts a shard's floor to f, dropping the pages below it.
func (st *replayed) raise(f uint64) {
	if f <= st.floor {
		return
	}
	st.floor = f
	i := 0
	for i < len(st.pages) && st.pages[i].first < f {
		i++
	}
	st.pages = st.pages[i:]
}

func (r *replay) apply(e entry, g *group) error {
	switch e.kind {
	case entryPage:
		st := r.shard(e.shard)
		if e.first < st.floor {
			return nil // sealed: a later entry dropped it, or a checkpoint knew it would
		}
		if n := len(st.pages); n > 0 && st.pages[n-1].next() != e.first {
			return &CorruptionError{Shard: e.shard, Offset: e.first, Reason: fmt.Sprintf("page follows offset %d: a page is missing", st.pages[n-1].next())}
		}
		st.pages = append(st.pages, pageRef{
			first: e.first, count: uint32(e.page.count), n: uint32(e.n), rel: uint32(e.at),
			payload: e.page.payload, appended: e.page.appendedAt.UnixNano(), g: g,
		})
	case entryFloor:
		r.shard(e.shard).raise(e.v)
	case entryReset:
		st := r.shard(e.shard)
		st.pages, st.floor, st.reset = nil, e.v, g.seq
	case entryEpoch:
		r.shard(e.shard).epoch = e.v
	case entryCheckpoint:
		for _, c := range e.lines {
			st := r.shard(c.shard)
			st.epoch = c.epoch
			st.raise(c.floor)
		}
	}
	return nil
}

// segment replays the groups of segment s, whose bytes are data, and returns where
// its groups end and whether the last was flagged as the segment's last. A group
// that fails its checks ends the segment if nothing was synced after it: it is the
// torn write a crash interrupted, which nobody was told had landed. Any valid group
// after it, or a segment other than the newest ending without its last group, is
// damage to synced bytes, reported with its place.
func (r *replay) segment(s *segment, data []byte, newest bool) (end int64, closed bool, err error) {
	damaged := func(pos int, reason string) error {
		return &SegmentError{Segment: s.name, Offset: int64(pos), Reason: reason}
	}
	for pos := 0; ; {
		h, ok := parseGroupHeader(data[pos:])
		ok = ok && h.segment == s.num
		if ok && r.seq != 0 && h.seq != r.seq+1 {
			return 0, false, damaged(pos, fmt.Sprintf("group %d follows group %d: groups are missing", h.seq, r.seq))
		}
		reason := "no group header"
		var entries []entry
		if ok {
			body := data[pos+groupHeaderLen:]
			if int(h.length) > len(body) {
				ok, reason = false, fmt.Sprintf("group %d of %d bytes runs past the file's end", h.seq, h.length)
			} else if entries, err = decodeEntries(body[:h.length]); err != nil {
				ok, reason = false, fmt.Sprintf("group %d: %v", h.seq, err)
			}
		}
		if !ok {
			if later := nextGroupHeader(data[min(pos+1, len(data)):], s.num, r.seq+1); later >= 0 {
				return 0, false, damaged(pos, fmt.Sprintf("%s, and a synced group follows at byte %d", reason, pos+1+later))
			}
			if !newest {
				return 0, false, damaged(pos, reason+": the segment ends without its last group")
			}
			return int64(pos), false, nil
		}
		if pos == 0 && len(entries) > 0 && entries[0].kind == entryCheckpoint {
			s.checkpointed = true // the segments before it may go
		}
		g := &group{seq: h.seq, seg: s, base: int64(pos + groupHeaderLen), done: closedDone}
		for _, e := range entries {
			if err := r.apply(e, g); err != nil {
				return 0, false, err
			}
		}
		if r.first == 0 {
			r.first = h.seq
		}
		r.seq = h.seq
		pos += groupHeaderLen + int(h.length)
		if h.flags&groupLast != 0 {
			return int64(pos), true, nil
		}
	}
}

var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// recovered is what open found in the log's directory.
type recovered struct {
	shards map[string]*replayed
	segs   []*segment // replayed, oldest first, with their read handles open
	pool   []string   // files to reuse
	// leftover are the other files outside the run, to remove once the log is
	// accepted: a refused log stays as found.
	leftover []string
	first    uint64 // the first replayed group's sequence, 0 for none
	seq      uint64 // the next group's sequence
	// The newest segment, where its groups end, and whether the last is flagged.
	newest *segment
	end    int64
	closed bool
}

// settle makes the newest segment's groups durable before anything is written after
// them: its bytes may have been read from the page cache of a life killed before its
// fdatasync returned. A segment that ended torn gets its empty last group there,
// over the torn bytes, with the sequence before seq.
func (rec *recovered) settle(fs vfs.FS) error {
	s := rec.newest
	if s == nil {
		return nil
	}
	f, err := fs.OpenReadWrite(s.name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("wal: settle segment %s: %w", s.name, err)
	}
	if !rec.closed {
		b := make([]byte, groupHeaderLen)
		putGroupHeader(b, groupHeader{segment: s.num, seq: rec.seq - 1, flags: groupLast})
		if _, err := f.WriteAt(b, rec.end); err != nil {
			f.Close()
			return fmt.Errorf("wal: close segment %s: %w", s.name, err)
		}
	}
	if err := f.SyncData(); err != nil {
		f.Close()
		return fmt.Errorf("wal: settle segment %s: %w", s.name, err)
	}
	return f.Close()
}

// removeLeftovers removes the files outside the run that the pool has no room for.
// It runs only once the log is accepted: until then a file outside the run may be
// the older part of a log whose middle segment was lost, which an operator can
// still mend.
func (rec *recovered) removeLeftovers(fs vfs.FS) error {
	for _, name := range rec.leftover {
		if err := fs.Remove(name); err != nil {
			return fmt.Errorf("wal: remove leftover segment: %w", err)
		}
	}
	return nil
}

// recoverSegments replays the unbroken run of segments that ends at the newest.
// Older files, which a crash left behind after their removal, are set aside for
// reuse or removal; nothing is changed on disk. The newest segment is left as
// found: settle closes and syncs it.
func recoverSegments(fs vfs.FS, dir string, opts Options) (*recovered, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	var nums []uint64
	for _, name := range names {
		if name == "CURRENT" || strings.HasPrefix(name, "MANIFEST-") {
			return nil, fmt.Errorf("wal: %s holds a log in the pebble format of l0 before segments (%s): seal or drain its shards with that version, then remove it: %w", dir, name, ErrFormat)
		}
		if n, ok := parseSegmentName(name); ok {
			nums = append(nums, n)
		}
	}
	slices.Sort(nums)
	run := max(len(nums)-1, 0)
	for run > 0 && nums[run-1]+1 == nums[run] {
		run--
	}
	rec := &recovered{shards: make(map[string]*replayed)}
	for _, n := range nums[:run] {
		name := fs.PathJoin(dir, segmentName(n))
		if len(rec.pool) < opts.RecycleSegments {
			rec.pool = append(rec.pool, name)
		} else {
			rec.leftover = append(rec.leftover, name)
		}
	}
	r := &replay{shards: rec.shards}
	closeAll := func() {
		for _, s := range rec.segs {
			s.r.Close()
		}
	}
	var end int64
	closed := true
	var data []byte // one buffer for every segment: the replay keeps nothing of it
	for i, n := range nums[run:] {
		s := &segment{num: n, name: fs.PathJoin(dir, segmentName(n))}
		data, err = fsutil.ReadFileInto(fs, s.name, data)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("wal: read segment: %w", err)
		}
		if s.r, err = fs.Open(s.name); err != nil {
			closeAll()
			return nil, fmt.Errorf("wal: open segment: %w", err)
		}
		rec.segs = append(rec.segs, s)
		if end, closed, err = r.segment(s, data, i == len(nums)-run-1); err != nil {
			closeAll()
			return nil, err
		}
	}
	if len(rec.segs) > 0 {
		rec.newest, rec.end, rec.closed = rec.segs[len(rec.segs)-1], end, closed
		if !closed {
			r.seq++ // the closing group's
		}
	}
	for id, st := range rec.shards {
		if len(st.pages) > 0 && st.pages[0].first != st.floor {
			closeAll()
			return nil, &CorruptionError{Shard: id, Offset: st.pages[0].first, Reason: fmt.Sprintf("the first page, above the floor %d: a page is missing", st.floor)}
		}
		for _, p := range st.pages {
			p.g.seg.live++
		}
	}
	rec.first, rec.seq = r.first, r.seq+1
	return rec, nil
}
