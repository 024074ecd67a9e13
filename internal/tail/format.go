package tail

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/l0store/l0/internal/varint"
)

// Version is the format version this package writes and reads.
const Version = 1

const (
	magic      = "l0tail\x00"
	trailerLen = 24
	// entryFixed is an index entry's bytes besides its shard id.
	entryFixed = 1 + 8 + 8 + 8 + 8 + 4 + 4
	// indexFixed is the index's bytes besides its entries.
	indexFixed = 8 + 8 + 4 + 4
	// MaxID is the longest shard id, instance or writer id an object holds.
	MaxID = math.MaxUint8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// The package's errors.
var (
	// ErrCorrupt is matched by every *CorruptionError.
	ErrCorrupt = errors.New("tail: corrupt object")
	// ErrFence reports a zero-byte object: a fence, which ends a stream.
	ErrFence = errors.New("tail: a fence")
	// ErrInvalid reports an object Encode refuses to write.
	ErrInvalid = errors.New("tail: invalid object")
)

// CorruptionError says where a tail object failed a check.
type CorruptionError struct {
	Pos    int64 // the byte position of what failed
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("tail: corrupt object at byte %d: %s", e.Pos, e.Reason)
}

func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }

func corrupt(pos int64, format string, args ...any) error {
	return &CorruptionError{Pos: pos, Reason: fmt.Sprintf(format, args...)}
}

// Header names the stream an object belongs to and its place in it.
type Header struct {
	Instance    string // the engine instance whose stream it is
	Incarnation uint64 // which of the instance's streams
	Sequence    uint64 // the object's place in the stream, from 0
	// Writer is unique per writing process: it tells an object this process wrote
	// from another's when a put-if-absent's reply was lost.
	Writer string
}

// Section is one shard's records in an object: offsets [First, First+len(Records)).
type Section struct {
	Shard   string
	Epoch   uint64 // the owner epoch the records were appended under
	First   uint64
	Records [][]byte
}

// Entry is an index entry: where a shard's section is and what it holds.
type Entry struct {
	Shard       string
	Epoch       uint64
	First, Next uint64 // offsets [First, Next)
	Pos         int64  // of the section in the object
	Len         uint32
	CRC         uint32
}

// Index is an object's index.
type Index struct {
	Sequence, Incarnation uint64
	Entries               []Entry
}

// Find returns the entry of shard.
func (ix Index) Find(shard string) (Entry, bool) {
	for _, e := range ix.Entries {
		if e.Shard == shard {
			return e, true
		}
	}
	return Entry{}, false
}

// Key is the object key of sequence seq of the instance's stream incarnation.
// Keys of one stream sort by sequence.
func Key(instance string, incarnation, seq uint64) string {
	return fmt.Sprintf("tail/%s/%020d/%020d", instance, incarnation, seq)
}

// Encode lays out one object. Every section holds at least one record, no record is
// empty, shards appear once, and ids are at most MaxID bytes; anything else is
// ErrInvalid.
func Encode(h Header, sections []Section) ([]byte, error) { return AppendEncoded(nil, h, sections) }

// AppendEncoded is Encode into dst's storage, which it uses if large enough: a
// writer that puts one object after another lays each out in the same memory,
// where a new one of megabytes would be zeroed and faulted in first (a third of
// the cost of encoding, in a profile of appends in Local mode).
func AppendEncoded(dst []byte, h Header, sections []Section) ([]byte, error) {
	if len(h.Instance) == 0 || len(h.Instance) > MaxID || len(h.Writer) > MaxID {
		return nil, fmt.Errorf("%w: instance %q, writer %q", ErrInvalid, h.Instance, h.Writer)
	}
	// Sized once: objects hold megabytes, and growing them by appends copied every
	// byte again at each doubling (the largest cost of a flush in a profile).
	size := 7 + 1 + 8 + 8 + 2 + len(h.Instance) + len(h.Writer) + 4 + 8 + 8 + 4 + 4 + 24
	for _, s := range sections {
		size += 1 + len(s.Shard) + 4*8 + 4 + 4
		for _, r := range s.Records {
			size += binary.MaxVarintLen64 + len(r)
		}
	}
	buf := dst[:0]
	if cap(buf) < size {
		buf = make([]byte, 0, size)
	}
	buf = append(append(buf, magic[:7]...), Version)
	buf = binary.BigEndian.AppendUint64(buf, h.Sequence)
	buf = binary.BigEndian.AppendUint64(buf, h.Incarnation)
	buf = append(append(buf, byte(len(h.Instance))), h.Instance...)
	buf = append(append(buf, byte(len(h.Writer))), h.Writer...)
	buf = binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, castagnoli))
	seen := map[string]bool{}
	entries := make([]Entry, 0, len(sections))
	for _, s := range sections {
		if err := checkPage(s.Shard, s.First, s.Records); err != nil || seen[s.Shard] {
			return nil, fmt.Errorf("%w: section of shard %q with %d records", ErrInvalid, s.Shard, len(s.Records))
		}
		seen[s.Shard] = true
		start := len(buf)
		for _, r := range s.Records {
			buf = binary.AppendUvarint(buf, uint64(len(r)))
			buf = append(buf, r...)
		}
		if len(buf)-start > math.MaxUint32 {
			return nil, fmt.Errorf("%w: section of shard %q over 4 GiB", ErrInvalid, s.Shard)
		}
		entries = append(entries, Entry{Shard: s.Shard, Epoch: s.Epoch, First: s.First, Next: s.First + uint64(len(s.Records)),
			Pos: int64(start), Len: uint32(len(buf) - start), CRC: crc32.Checksum(buf[start:], castagnoli)})
	}
	indexPos := len(buf)
	buf = binary.BigEndian.AppendUint64(buf, h.Sequence)
	buf = binary.BigEndian.AppendUint64(buf, h.Incarnation)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(entries)))
	for _, e := range entries {
		buf = append(append(buf, byte(len(e.Shard))), e.Shard...)
		for _, v := range []uint64{e.Epoch, e.First, e.Next, uint64(e.Pos)} {
			buf = binary.BigEndian.AppendUint64(buf, v)
		}
		buf = binary.BigEndian.AppendUint32(buf, e.Len)
		buf = binary.BigEndian.AppendUint32(buf, e.CRC)
	}
	buf = binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf[indexPos:], castagnoli))
	trailer := binary.BigEndian.AppendUint64(nil, uint64(indexPos))
	trailer = binary.BigEndian.AppendUint32(trailer, uint32(len(buf)-indexPos))
	trailer = binary.BigEndian.AppendUint32(trailer, crc32.Checksum(trailer, castagnoli))
	trailer = append(append(trailer, Version), magic[:7]...)
	return append(buf, trailer...), nil
}

// checkPage reports whether records of shard from offset first can be in an
// object: a shard id of 1 to MaxID bytes, at least one record, none empty, and
// offsets that do not wrap.
func checkPage(shard string, first uint64, recs [][]byte) error {
	switch {
	case len(shard) == 0 || len(shard) > MaxID:
		return fmt.Errorf("%w: shard id %q", ErrInvalid, shard)
	case len(recs) == 0:
		return fmt.Errorf("%w: no records for shard %q", ErrInvalid, shard)
	case first+uint64(len(recs)) < first:
		return fmt.Errorf("%w: offsets of shard %q wrap past %d", ErrInvalid, shard, first)
	}
	for _, r := range recs {
		if len(r) == 0 {
			return fmt.Errorf("%w: an empty record for shard %q", ErrInvalid, shard)
		}
	}
	return nil
}

// ReadIndex reads the index of the object of size bytes that r holds, with two
// reads: the trailer, then the index. A zero-byte object is ErrFence.
func ReadIndex(r io.ReaderAt, size int64) (Index, error) {
	if size == 0 {
		return Index{}, ErrFence
	}
	if size < trailerLen {
		return Index{}, corrupt(0, "%d bytes, shorter than a trailer", size)
	}
	t := make([]byte, trailerLen)
	if _, err := r.ReadAt(t, size-trailerLen); err != nil {
		return Index{}, err
	}
	tpos := size - trailerLen
	if string(t[17:]) != magic[:7] || t[16] != Version {
		return Index{}, corrupt(tpos+16, "no trailer: version %d, magic %q", t[16], t[17:])
	}
	if crc32.Checksum(t[:12], castagnoli) != binary.BigEndian.Uint32(t[12:16]) {
		return Index{}, corrupt(tpos, "trailer checksum mismatch")
	}
	pos, n := binary.BigEndian.Uint64(t[:8]), int64(binary.BigEndian.Uint32(t[8:12]))
	if pos > uint64(tpos) || n < indexFixed || int64(pos)+n != tpos {
		return Index{}, corrupt(tpos, "index at %d, %d bytes, in an object of %d", pos, n, size)
	}
	data := make([]byte, n)
	if _, err := r.ReadAt(data, int64(pos)); err != nil {
		return Index{}, err
	}
	return parseIndex(data, int64(pos))
}

// parseIndex decodes an index that sits at pos, every entry's section before pos.
func parseIndex(data []byte, pos int64) (Index, error) {
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[len(body):]) {
		return Index{}, corrupt(pos, "index checksum mismatch")
	}
	ix := Index{Sequence: binary.BigEndian.Uint64(body), Incarnation: binary.BigEndian.Uint64(body[8:])}
	count := binary.BigEndian.Uint32(body[16:])
	rest := body[20:]
	if uint64(count) > uint64(len(rest))/(entryFixed) {
		return Index{}, corrupt(pos+16, "%d entries in %d bytes", count, len(rest))
	}
	ix.Entries = make([]Entry, 0, count)
	at := pos + 20
	for range count {
		if len(rest) < 1 || len(rest) < entryFixed+int(rest[0]) {
			return Index{}, corrupt(at, "entry cut short")
		}
		idLen := int(rest[0])
		e := Entry{Shard: string(rest[1 : 1+idLen])}
		f := rest[1+idLen:]
		e.Epoch, e.First, e.Next = binary.BigEndian.Uint64(f), binary.BigEndian.Uint64(f[8:]), binary.BigEndian.Uint64(f[16:])
		sectionPos := binary.BigEndian.Uint64(f[24:])
		e.Len, e.CRC = binary.BigEndian.Uint32(f[32:]), binary.BigEndian.Uint32(f[36:])
		switch {
		case idLen == 0:
			return Index{}, corrupt(at, "an entry without a shard")
		case e.Next <= e.First:
			return Index{}, corrupt(at, "shard %q: offsets [%d, %d)", e.Shard, e.First, e.Next)
		case sectionPos > uint64(pos) || sectionPos+uint64(e.Len) > uint64(pos) || e.Next-e.First > uint64(e.Len):
			return Index{}, corrupt(at, "shard %q: a section of %d records at %d, %d bytes, before an index at %d", e.Shard, e.Next-e.First, sectionPos, e.Len, pos)
		}
		e.Pos = int64(sectionPos)
		if _, dup := ix.Find(e.Shard); dup {
			return Index{}, corrupt(at, "shard %q twice", e.Shard)
		}
		ix.Entries = append(ix.Entries, e)
		rest, at = f[entryFixed-1:], at+int64(entryFixed+idLen)
	}
	if len(rest) != 0 {
		return Index{}, corrupt(at, "%d bytes after the last entry", len(rest))
	}
	return ix, nil
}

// ReadSection reads and checks e's section from r and returns its records, each
// a fresh slice.
func ReadSection(r io.ReaderAt, e Entry) ([][]byte, error) {
	data := make([]byte, e.Len)
	if _, err := r.ReadAt(data, e.Pos); err != nil {
		return nil, err
	}
	return DecodeSection(e, data)
}

// DecodeSection checks data, e's section, against e and returns its records; they
// share data's memory.
func DecodeSection(e Entry, data []byte) ([][]byte, error) {
	if uint32(len(data)) != e.Len || crc32.Checksum(data, castagnoli) != e.CRC {
		return nil, corrupt(e.Pos, "section of shard %q: checksum mismatch", e.Shard)
	}
	recs := make([][]byte, 0, min(e.Next-e.First, uint64(len(data))/2))
	for len(data) > 0 {
		n, k := varint.Uvarint(data)
		if k <= 0 || n == 0 || n > uint64(len(data)-k) {
			return nil, corrupt(e.Pos+int64(int(e.Len)-len(data)), "section of shard %q: bad record length", e.Shard)
		}
		recs, data = append(recs, data[k:k+int(n)]), data[k+int(n):]
	}
	if uint64(len(recs)) != e.Next-e.First {
		return nil, corrupt(e.Pos, "section of shard %q: %d records, the index says %d", e.Shard, len(recs), e.Next-e.First)
	}
	return recs, nil
}

// Decode reads a whole object: its header and index, and checks every section. The
// sections are in the index order, back to back, between the header and the
// index.
func Decode(data []byte) (Header, Index, [][][]byte, error) {
	if len(data) == 0 {
		return Header{}, Index{}, nil, ErrFence
	}
	h, end, err := parseHeader(data)
	if err != nil {
		return Header{}, Index{}, nil, err
	}
	ix, err := ReadIndex(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return Header{}, Index{}, nil, err
	}
	if ix.Sequence != h.Sequence || ix.Incarnation != h.Incarnation {
		return Header{}, Index{}, nil, corrupt(0, "header says sequence %d incarnation %d, index %d %d", h.Sequence, h.Incarnation, ix.Sequence, ix.Incarnation)
	}
	sections := make([][][]byte, len(ix.Entries))
	at := int64(end)
	for i, e := range ix.Entries {
		if e.Pos != at {
			return Header{}, Index{}, nil, corrupt(at, "section of shard %q at %d, want %d", e.Shard, e.Pos, at)
		}
		if sections[i], err = DecodeSection(e, data[e.Pos:e.Pos+int64(e.Len)]); err != nil {
			return Header{}, Index{}, nil, err
		}
		at += int64(e.Len)
	}
	if indexPos := int64(binary.BigEndian.Uint64(data[len(data)-trailerLen:])); at != indexPos {
		return Header{}, Index{}, nil, corrupt(at, "%d bytes between the last section and the index", indexPos-at)
	}
	return h, ix, sections, nil
}

func parseHeader(data []byte) (Header, int, error) {
	if len(data) < 7+1+16+1 || string(data[:7]) != magic[:7] || data[7] != Version {
		return Header{}, 0, corrupt(0, "no header")
	}
	h := Header{Sequence: binary.BigEndian.Uint64(data[8:]), Incarnation: binary.BigEndian.Uint64(data[16:])}
	at := 24
	id := func() (string, bool) {
		if at >= len(data) || at+1+int(data[at]) > len(data) {
			return "", false
		}
		s := string(data[at+1 : at+1+int(data[at])])
		at += 1 + int(data[at])
		return s, true
	}
	var ok1, ok2 bool
	h.Instance, ok1 = id()
	h.Writer, ok2 = id()
	if !ok1 || !ok2 || h.Instance == "" || at+4 > len(data) {
		return Header{}, 0, corrupt(int64(at), "header cut short")
	}
	if crc32.Checksum(data[:at], castagnoli) != binary.BigEndian.Uint32(data[at:]) {
		return Header{}, 0, corrupt(int64(at), "header checksum mismatch")
	}
	return h, at + 4, nil
}
