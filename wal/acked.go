package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/internal/varint"
)

// The acknowledged-watermark file. Changing any of these changes the on-disk format.
//
// Damage to the newest segment's last groups reads at open as the torn write a crash
// leaves, which is dropped: every record in it, although synced and acknowledged, would
// be lost without an error. So the Log keeps, beside its segments, a lower bound of
// what it has acknowledged: per shard the floor and the end of the acknowledged
// records. Open refuses a log that replays to less.
//
//	+-----------+---------+--------------+---------------------------------------+----------+
//	| magic     | version | shard count  | per shard: uvarint id length, id,     | CRC-32C  |
//	| "l0ack"   | 1 byte  | uint32 BE    | floor uint64 BE, acked uint64 BE      | uint32 BE|
//	+-----------+---------+--------------+---------------------------------------+----------+
//
// It is replaced atomically (temp file, fsync, rename, directory fsync) at most once
// per Options.AckedInterval while appends or truncations happen, at Close, and at an
// open whose log recovered other than it says.
const (
	ackedFile     = "l0-acked"
	ackedMagic    = "l0ack"
	ackedVersion  = 1
	maxAckedCount = 1 << 24
)

// mark is what the Log had durably done to one shard when the watermark was written.
type mark struct {
	floor uint64 // the shard's floor
	acked uint64 // the end of its acknowledged records
}

func encodeMarks(marks map[string]mark) []byte {
	b := append([]byte(ackedMagic), ackedVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(len(marks)))
	for _, id := range slices.Sorted(maps.Keys(marks)) {
		m := marks[id]
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
		b = binary.BigEndian.AppendUint64(b, m.floor)
		b = binary.BigEndian.AppendUint64(b, m.acked)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func decodeMarks(b []byte) (map[string]mark, error) {
	corrupt := func(reason string) error { return fmt.Errorf("wal: %s: %s: %w", ackedFile, reason, ErrCorrupt) }
	head := len(ackedMagic) + 1 + 4
	if len(b) < head+crcLen || string(b[:len(ackedMagic)]) != ackedMagic {
		return nil, corrupt("not a watermark file")
	}
	body := b[:len(b)-crcLen]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[len(body):]) {
		return nil, corrupt("checksum mismatch")
	}
	if v := b[len(ackedMagic)]; v != ackedVersion {
		return nil, corrupt(fmt.Sprintf("unknown version %d", v))
	}
	n := binary.BigEndian.Uint32(b[len(ackedMagic)+1:])
	rest := body[head:]
	// An entry takes at least 17 bytes (a one-byte length, an empty id, two
	// uint64s): a count the bytes cannot hold is damage, found before allocating.
	if n > maxAckedCount || uint64(n) > uint64(len(rest))/17 {
		return nil, corrupt(fmt.Sprintf("%d shards in %d bytes", n, len(rest)))
	}
	marks := make(map[string]mark, n)
	for range n {
		l, k := varint.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) || uint64(len(rest)-k)-l < 16 {
			return nil, corrupt("truncated or malformed entry")
		}
		id := string(rest[k : k+int(l)])
		rest = rest[k+int(l):]
		marks[id] = mark{floor: binary.BigEndian.Uint64(rest), acked: binary.BigEndian.Uint64(rest[8:])}
		rest = rest[16:]
	}
	if len(rest) != 0 {
		return nil, corrupt("trailing bytes")
	}
	return marks, nil
}

// readMarks reads the watermark file of dir; a missing file is no watermark.
func readMarks(fsys vfs.FS, dir string) (map[string]mark, error) {
	b, err := fsutil.ReadFile(fsys, fsys.PathJoin(dir, ackedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	return decodeMarks(b)
}

// writeMarks replaces the watermark file of dir atomically and durably.
func writeMarks(fsys vfs.FS, dir string, marks map[string]mark) error {
	return fsutil.WriteFileAtomic(fsys, fsys.PathJoin(dir, ackedFile), encodeMarks(marks))
}

// checkMarks compares what the log replayed with the watermark: a shard that ends
// before its acknowledged records, or whose floor went back, lost synced data.
func (l *Log) checkMarks(marks map[string]mark) error {
	for _, id := range slices.Sorted(maps.Keys(marks)) {
		m := marks[id]
		st := l.stateLocked(id)
		switch {
		case st.mu.next < m.acked:
			return &CorruptionError{Shard: id, Offset: st.mu.next, Reason: fmt.Sprintf(
				"acknowledged records %d to %d are missing: the log replayed short of what was synced", st.mu.next, m.acked-1)}
		case st.mu.floor < m.floor:
			return &CorruptionError{Shard: id, Offset: st.mu.floor, Reason: fmt.Sprintf(
				"the floor went back from %d: a durable truncation is missing", m.floor)}
		}
	}
	return nil
}

// marks returns the watermark of every shard now. It takes no shard's lock.
func (l *Log) marks() map[string]mark {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make(map[string]mark, len(l.mu.shards))
	for id, st := range l.mu.shards {
		m := mark{floor: st.floorMark.Load(), acked: st.acked.Load()}
		if m != (mark{}) {
			out[id] = m
		}
	}
	return out
}

// lowerAckedLocked lowers the shard's acknowledged end to end, durably in the
// watermark file, before a reset drops records below what it claims; st.mu is held.
// If that write fails the end goes back to what it was: the reset does not happen,
// every page is still there and synced, and reads and Extent must reach them. Under
// st.mu nothing else moves the end, so only the watermark writer can have seen the
// lowered one, and a lower bound is what it may write; the next write covers the
// end again.
func (l *Log) lowerAckedLocked(st *shardState, end uint64) error {
	was := st.acked.Load()
	if end >= was {
		return nil
	}
	st.acked.Store(end)
	if err := l.writeMarksNow(); err != nil {
		st.acked.Store(was)
		l.changes.Add(1)
		return err
	}
	return nil
}

// syncMarks writes the watermark whenever it changed, at most once per interval,
// until stop is closed.
func (l *Log) syncMarks(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case <-l.opts.Clock.After(l.opts.AckedInterval):
			if err := l.writeMarksIfChanged(); err != nil {
				l.opts.Logger.Error("wal: writing the acknowledged watermark", "err", err)
			}
		}
	}
}

func (l *Log) writeMarksIfChanged() error {
	l.marksMu.Lock()
	defer l.marksMu.Unlock()
	if l.changes.Load() == l.written {
		return nil
	}
	return l.writeMarksLocked()
}

// writeMarksNow writes the watermark at once, whether or not it changed.
func (l *Log) writeMarksNow() error {
	l.marksMu.Lock()
	defer l.marksMu.Unlock()
	return l.writeMarksLocked()
}

func (l *Log) writeMarksLocked() error {
	gen := l.changes.Load()
	if err := writeMarks(l.opts.FS, l.dir, l.marks()); err != nil {
		return fmt.Errorf("wal: writing the acknowledged watermark: %w", err)
	}
	l.written = gen
	return nil
}
