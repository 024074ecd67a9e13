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
// be lost without an error, and so would an owner epoch or a reset logged there. So the
// Log keeps, beside its segments, a lower bound of what it has durably done: per shard
// the floor, the end of the acknowledged records, the owner epoch, and where its last
// reset is. Open refuses a log that replays to less.
//
//	+-----------+---------+--------------+---------------------------------------+----------+
//	| magic     | version | shard count  | per shard: uvarint id length, id,     | CRC-32C  |
//	| "l0ack"   | 1 byte  | uint32 BE    | floor uint64 BE, acked uint64 BE,     | uint32 BE|
//	|           |         |              | epoch uint64 BE, reset uint64 BE      |          |
//	+-----------+---------+--------------+---------------------------------------+----------+
//
// reset is the sequence of the group that holds the shard's last reset, 0 for none.
// Version 1, the first format, has no epoch and reset: it is still read, as epoch 0
// and no reset, and the next write replaces it with version 2.
//
// It is replaced atomically (temp file, fsync, rename, directory fsync) at most once
// per Options.AckedInterval while appends, truncations and resets happen, before
// SetEpoch returns, at Close, and at an open whose log recovered other than it says.
const (
	ackedFile     = "l0-acked"
	ackedMagic    = "l0ack"
	ackedVersion  = 2
	ackedVersion1 = 1
	maxAckedCount = 1 << 24
)

// mark is what the Log had durably done to one shard when the watermark was written.
type mark struct {
	floor uint64 // the shard's floor
	acked uint64 // the end of its acknowledged records
	epoch uint64 // its owner epoch
	reset uint64 // the sequence of the group holding its last reset; 0 for none
}

// markLen is the bytes of a mark after its id, in a file of version v.
func markLen(v byte) int {
	if v == ackedVersion1 {
		return 16
	}
	return 32
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
		b = binary.BigEndian.AppendUint64(b, m.epoch)
		b = binary.BigEndian.AppendUint64(b, m.reset)
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
	v := b[len(ackedMagic)]
	if v != ackedVersion && v != ackedVersion1 {
		return nil, corrupt(fmt.Sprintf("unknown version %d", v))
	}
	size := markLen(v)
	n := binary.BigEndian.Uint32(b[len(ackedMagic)+1:])
	rest := body[head:]
	// An entry takes at least a one-byte length, an empty id and its mark: a count
	// the bytes cannot hold is damage, found before allocating.
	if n > maxAckedCount || uint64(n) > uint64(len(rest))/uint64(1+size) {
		return nil, corrupt(fmt.Sprintf("%d shards in %d bytes", n, len(rest)))
	}
	marks := make(map[string]mark, n)
	for range n {
		l, k := varint.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) || uint64(len(rest)-k)-l < uint64(size) {
			return nil, corrupt("truncated or malformed entry")
		}
		id := string(rest[k : k+int(l)])
		rest = rest[k+int(l):]
		m := mark{floor: binary.BigEndian.Uint64(rest), acked: binary.BigEndian.Uint64(rest[8:])}
		if v != ackedVersion1 {
			m.epoch, m.reset = binary.BigEndian.Uint64(rest[16:]), binary.BigEndian.Uint64(rest[24:])
		}
		marks[id] = m
		rest = rest[size:]
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
// before its acknowledged records, whose floor or owner epoch went back, or whose
// last reset is missing from a log that still holds the group it was in, lost synced
// data. first is the sequence of the first group replayed, 0 for none: a reset in a
// group before it is gone with every page it dropped, which were all before it.
func (l *Log) checkMarks(marks map[string]mark, first uint64) error {
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
		case st.mu.epoch < m.epoch:
			return &CorruptionError{Shard: id, Offset: st.mu.next, Reason: fmt.Sprintf(
				"the owner epoch went back from %d to %d: a durable SetEpoch is missing", m.epoch, st.mu.epoch)}
		case m.reset != 0 && st.resetMark.Load() < m.reset && first != 0 && first <= m.reset:
			return &CorruptionError{Shard: id, Offset: st.mu.floor, Reason: fmt.Sprintf(
				"the reset in group %d is missing from a log that holds groups from %d: the pages it dropped would be back", m.reset, first)}
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
		m := mark{floor: st.floorMark.Load(), acked: st.acked.Load(), epoch: st.epochMark.Load(), reset: st.resetMark.Load()}
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

// coverMarks returns once a watermark written after the change numbered gen (what
// changes.Add returned) is durable: one that another call wrote meanwhile, or its
// own. Calls that wait together share a write.
func (l *Log) coverMarks(gen uint64) error {
	l.marksMu.Lock()
	defer l.marksMu.Unlock()
	if l.written >= gen {
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
	// Loaded before the marks: a write that saw a change's number saw its mark.
	gen := l.changes.Load()
	if err := writeMarks(l.opts.FS, l.dir, l.marks()); err != nil {
		return fmt.Errorf("wal: writing the acknowledged watermark: %w", err)
	}
	l.written = gen
	return nil
}
