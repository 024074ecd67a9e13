package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/internal/fsutil"
)

// group is the entries one write and one fdatasync put on disk. Appenders add to the
// filling group under writer.mu; the flusher places it in a segment, writes it,
// syncs it and closes done.
type group struct {
	seq  uint64
	done chan struct{}
	err  error // set before done closes
	once sync.Once

	// Set by the flusher when it places the group, before done closes: the segment
	// and the file offset its body starts at. An entry's place is base plus where it
	// is in the body.
	seg  *segment
	base int64
	// pages counts the group's pages until it is placed, when they move to seg's
	// live count; guarded by writer.mu.
	pages int
}

// wait waits for the group's sync and returns its error.
func (g *group) wait() error {
	<-g.done
	return g.err
}

// finish ends the group with err; only its first call counts.
func (g *group) finish(err error) {
	g.once.Do(func() {
		g.err = err
		close(g.done)
	})
}

// segment is one file of the log.
type segment struct {
	num  uint64
	name string
	r    vfs.File // for reads
	// Guarded by writer.mu: pages not yet dropped, readers holding it, and (for the
	// current segment) the bytes placed in it.
	live, pins int
	size       int64
	// checkpointed is set once the segment's first group, which holds the
	// checkpoint of every shard's epoch and floor, is synced: only then may the
	// segments before it go, with the entries they hold.
	checkpointed bool
}

// pageRef is where a page of a shard is: its group and its place in the group's body.
type pageRef struct {
	first    uint64
	count    uint32
	n        uint32 // bytes of key and value
	rel      uint32 // from the group's base
	payload  uint64
	appended int64 // Unix nanoseconds
	g        *group
}

func (p pageRef) next() uint64 { return p.first + uint64(p.count) }

// at is where the page's bytes start in its segment file.
func (p pageRef) at() int64 { return p.g.base + int64(p.rel) }

// writer appends groups to the log's segments: one flusher goroutine writes and
// syncs the filling group while appenders fill the next, so that every fdatasync
// covers everything that arrived during the one before.
type writer struct {
	fs   vfs.FS
	dir  string
	opts Options

	mu struct {
		sync.Mutex
		room    sync.Cond // appenders wait here while the filling group is full
		buf     []byte    // the filling group: space for its header, then entries
		filling *group
		segs    []*segment // oldest first; the last is the current one
		pool    []string   // files of dropped segments kept to be reused, oldest first
		// obsolete are dropped segments the flusher has yet to close and recycle.
		obsolete []*segment
		// logged is every shard's epoch and floor as the entries added so far say, in
		// log order: what a checkpoint holds.
		logged     map[string]checkpointed
		checkpoint bool // the next group starts a segment
		err        error
	}
	spare []byte // the flusher's: the last group's buffer, reused
	file  vfs.File
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	// syncs counts the groups synced; written their bytes; writeNanos and
	// syncNanos the time in their writes and fsyncs (see Commits).
	syncs, written, writeNanos, syncNanos atomic.Uint64
	// started is set once the flusher runs.
	started bool
}

// maxGroupBytes bounds a filling group: appenders wait while it is larger, for the
// flusher to take it.
const maxGroupBytes = 32 << 20

func newWriter(fs vfs.FS, dir string, opts Options, segs []*segment, pool []string, logged map[string]checkpointed, seq uint64) *writer {
	w := &writer{fs: fs, dir: dir, opts: opts, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	w.mu.room.L = &w.mu.Mutex
	w.mu.segs, w.mu.pool, w.mu.logged = segs, pool, logged
	w.mu.buf = make([]byte, groupHeaderLen, 1<<20)
	w.spare = make([]byte, groupHeaderLen, 1<<20)
	w.mu.filling = &group{seq: seq, done: make(chan struct{})}
	w.mu.checkpoint = true
	return w
}

// start creates the first segment of this life and starts the flusher.
func (w *writer) start() error {
	num := uint64(1)
	if n := len(w.mu.segs); n > 0 {
		num = w.mu.segs[n-1].num + 1
	}
	for _, name := range w.mu.pool {
		if n, _ := parseSegmentName(name); n >= num {
			num = n + 1
		}
	}
	if err := w.create(num); err != nil {
		return err
	}
	// The segment's checkpoint is written and synced now, not with the life's first
	// entries: a life that writes none (an open then a Close, a kill while idle, an
	// open that fails later) would leave a segment without one, and the sealed
	// segments before it could go only once a later segment has one. With it, the
	// sealed segments the open replayed go at once.
	if !w.flushOne(true) {
		if err := w.failed(); err != nil {
			return err
		}
	}
	w.started = true
	go w.flush()
	return nil
}

// create makes segment num the current one: a pooled file reused, or a new one, and
// the directory synced, so that no acknowledged group is in a file a crash unnames.
func (w *writer) create(num uint64) error {
	name := w.fs.PathJoin(w.dir, segmentName(num))
	w.mu.Lock()
	var reuse string
	if len(w.mu.pool) > 0 {
		reuse, w.mu.pool = w.mu.pool[0], w.mu.pool[1:]
	}
	w.mu.Unlock()
	var (
		f   vfs.File
		err error
	)
	if reuse != "" {
		f, err = w.fs.ReuseForWrite(reuse, name, vfs.WriteCategoryUnspecified)
	} else {
		f, err = w.fs.Create(name, vfs.WriteCategoryUnspecified)
	}
	if err != nil {
		return fmt.Errorf("wal: create segment %s: %w", name, err)
	}
	if err := fsutil.SyncDir(w.fs, w.dir); err != nil {
		f.Close()
		return fmt.Errorf("wal: create segment %s: %w", name, err)
	}
	r, err := w.fs.Open(name)
	if err != nil {
		f.Close()
		return fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	if w.file != nil {
		w.file.Close()
	}
	w.file = f
	w.mu.Lock()
	w.mu.segs = append(w.mu.segs, &segment{num: num, name: name, r: r})
	w.mu.checkpoint = true
	w.mu.Unlock()
	return nil
}

// addLocked adds entries to the filling group, after waiting for room in it: add
// appends them to the buffer. w.mu is held; it returns the group, or the error that
// stopped the log.
func (w *writer) addLocked(add func(buf []byte) []byte) (*group, error) {
	for w.mu.err == nil && len(w.mu.buf) > maxGroupBytes {
		w.mu.room.Wait()
	}
	return w.addNowLocked(add)
}

// addNowLocked is addLocked without the wait, for entries that must join the group
// of the ones just added.
func (w *writer) addNowLocked(add func(buf []byte) []byte) (*group, error) {
	if err := w.mu.err; err != nil {
		return nil, err
	}
	w.mu.buf = add(w.mu.buf)
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return w.mu.filling, nil
}

// addShardEntry adds a floor, reset or epoch entry, which the caller waits for.
func (w *writer) addShardEntry(kind byte, shard string, v uint64) (*group, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addLocked(func(buf []byte) []byte {
		w.noteLocked(kind, shard, v)
		return appendShardEntry(buf, kind, shard, v)
	})
}

// noteLocked records in logged what an entry sets.
func (w *writer) noteLocked(kind byte, shard string, v uint64) {
	c := w.mu.logged[shard]
	c.shard = shard
	switch kind {
	case entryEpoch:
		c.epoch = v
	case entryFloor:
		c.floor = max(c.floor, v)
	case entryReset:
		c.floor = v
	}
	w.mu.logged[shard] = c
}

// addPageLocked adds a page and returns where it is in the filling group; with now,
// without waiting for room.
func (w *writer) addPageLocked(shard string, first uint64, at int64, recs [][]byte, now bool) (pageRef, error) {
	add := w.addLocked
	if now {
		add = w.addNowLocked
	}
	var ref pageRef
	g, err := add(func(buf []byte) []byte {
		buf, at0, n := appendPageEntry(buf, shard, first, at, recs)
		ref = pageRef{first: first, count: uint32(len(recs)), n: uint32(n), rel: uint32(at0 - groupHeaderLen), appended: at}
		return buf
	})
	if err != nil {
		return pageRef{}, err
	}
	for _, r := range recs {
		ref.payload += uint64(len(r))
	}
	ref.g = g
	g.pages++
	return ref, nil
}

// flush is the flusher: it writes and syncs groups until stopped.
func (w *writer) flush() {
	defer close(w.done)
	for {
		select {
		case <-w.wake:
		case <-w.stop:
			return
		}
		for w.flushOne(false) {
		}
		w.recycle()
	}
}

// flushOne writes and syncs the filling group, if it holds anything (or, with
// checkpoint, if the current segment still needs its checkpoint), and reports
// whether it did.
func (w *writer) flushOne(checkpoint bool) bool {
	w.mu.Lock()
	if (len(w.mu.buf) == groupHeaderLen && !(checkpoint && w.mu.checkpoint)) || w.mu.err != nil {
		w.mu.Unlock()
		return false
	}
	g, buf := w.mu.filling, w.mu.buf
	w.mu.buf, w.spare = w.spare, nil
	w.mu.filling = &group{seq: g.seq + 1, done: make(chan struct{})}
	cur := w.mu.segs[len(w.mu.segs)-1]
	var ckpt []byte
	if w.mu.checkpoint {
		lines := make([]checkpointed, 0, len(w.mu.logged))
		for _, id := range slices.Sorted(maps.Keys(w.mu.logged)) {
			lines = append(lines, w.mu.logged[id])
		}
		ckpt = appendCheckpoint(nil, lines)
		w.mu.checkpoint = false
	}
	start := cur.size
	size := int64(len(buf) + len(ckpt))
	last := start+size >= w.opts.SegmentSize
	g.seg, g.base = cur, start+groupHeaderLen+int64(len(ckpt))
	cur.size += size
	cur.live += g.pages
	w.mu.room.Broadcast()
	w.mu.Unlock()

	h := groupHeader{segment: cur.num, seq: g.seq, length: uint32(int(size) - groupHeaderLen)}
	if last {
		h.flags = groupLast
	}
	out := buf
	if ckpt != nil {
		out = slices.Concat(buf[:groupHeaderLen], ckpt, buf[groupHeaderLen:])
	}
	putGroupHeader(out, h)
	if err := w.writeSync(out, g); err != nil {
		w.fail(g, err)
		return false
	}
	w.spare = buf[:groupHeaderLen]
	if ckpt != nil {
		w.mu.Lock()
		cur.checkpointed = true
		w.dropObsoleteLocked()
		w.mu.Unlock()
	}
	g.finish(nil)
	if last {
		// The last group is synced before the next segment exists: a segment other
		// than the newest always ends with its last group.
		if err := w.create(cur.num + 1); err != nil {
			w.fail(nil, err)
			return false
		}
	}
	return true
}

// writeSync writes one group and syncs it. A broken build acknowledges it before the
// sync.
func (w *writer) writeSync(out []byte, g *group) error {
	start := w.opts.Clock.Now()
	n, err := w.file.Write(out)
	w.written.Add(uint64(n))
	wrote := w.opts.Clock.Now()
	w.writeNanos.Add(uint64(max(wrote.Sub(start), 0)))
	if err != nil {
		return fmt.Errorf("wal: write: %w", err)
	}
	if broken.Is(broken.AckBeforeSync) {
		g.finish(nil)
	}
	err = w.file.SyncData()
	w.syncNanos.Add(uint64(max(w.opts.Clock.Now().Sub(wrote), 0)))
	if err != nil {
		return fmt.Errorf("wal: sync: %w", err)
	}
	w.syncs.Add(1)
	return nil
}

// fail stops the log after the write or sync of g (nil: of no group) failed: g and
// every later group fail with err.
func (w *writer) fail(g *group, err error) {
	w.mu.Lock()
	w.mu.err = err
	filling := w.mu.filling
	w.mu.room.Broadcast()
	w.mu.Unlock()
	if g != nil {
		g.finish(err)
	}
	filling.finish(err)
}

// failed returns the error that stopped the log, if one did.
func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.err
}

// pin keeps the segments of refs from being dropped while a reader reads them.
func (w *writer) pin(refs []pageRef) []*segment {
	w.mu.Lock()
	defer w.mu.Unlock()
	var segs []*segment
	for _, r := range refs {
		if s := r.g.seg; len(segs) == 0 || segs[len(segs)-1] != s {
			s.pins++
			segs = append(segs, s)
		}
	}
	return segs
}

func (w *writer) unpin(segs []*segment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range segs {
		s.pins--
	}
	w.dropObsoleteLocked()
}

// drop forgets pages whose removal is durable: a segment whose pages are all gone,
// and every segment before it, goes.
func (w *writer) drop(refs []pageRef) {
	if len(refs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range refs {
		r.g.seg.live--
	}
	w.dropObsoleteLocked()
}

// dropObsoleteLocked hands the flusher the oldest segments while none of their pages
// is live, no reader holds them, and a later segment has its checkpoint synced:
// their floor, reset and epoch entries are in it, since a checkpoint holds what
// every entry before it set. Any later one will do, not only the next: a segment
// that a life writing nothing left, closed at the next open with no checkpoint,
// holds no entry, and must not keep the segments before it. The current segment
// stays.
func (w *writer) dropObsoleteLocked() {
	segs := w.mu.segs
	ckpt := 0 // the newest checkpointed segment past the first, if any
	for i := len(segs) - 1; i > 0; i-- {
		if segs[i].checkpointed {
			ckpt = i
			break
		}
	}
	n := 0
	for n < ckpt && segs[n].live == 0 && segs[n].pins == 0 {
		n++
	}
	if n == 0 {
		return
	}
	w.mu.obsolete = append(w.mu.obsolete, w.mu.segs[:n]...)
	w.mu.segs = slices.Delete(w.mu.segs, 0, n)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// recycle closes the dropped segments and keeps their files to reuse, or removes
// them. A crash may undo a removal; open reads only the unbroken run of segments
// that ends at the newest.
func (w *writer) recycle() {
	w.mu.Lock()
	obsolete := w.mu.obsolete
	w.mu.obsolete = nil
	w.mu.Unlock()
	for _, s := range obsolete {
		s.r.Close()
		w.mu.Lock()
		keep := len(w.mu.pool) < w.opts.RecycleSegments
		if keep {
			w.mu.pool = append(w.mu.pool, s.name)
		}
		w.mu.Unlock()
		if !keep {
			if err := w.fs.Remove(s.name); err != nil {
				w.opts.Logger.Warn("wal: removing a sealed segment", "segment", s.name, "err", err)
			}
		}
	}
}

// segments returns how many segments are live and how many files wait for reuse.
func (w *writer) segments() (live, pooled int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.mu.segs), len(w.mu.pool)
}

// close stops the flusher and closes the files.
func (w *writer) close() error {
	if w.started {
		close(w.stop)
		<-w.done
	}
	w.recycle()
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for _, s := range w.mu.segs {
		errs = append(errs, s.r.Close())
	}
	if w.file != nil {
		errs = append(errs, w.file.Close())
	}
	return errors.Join(errs...)
}

// slowDisk logs what the disk-health checks report.
func slowDisk(l *slog.Logger) func(vfs.DiskSlowInfo) {
	return func(info vfs.DiskSlowInfo) {
		l.Warn("wal: slow disk", "path", info.Path, "op", info.OpType.String(), "duration", info.Duration.Round(time.Millisecond))
	}
}
