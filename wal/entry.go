package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/l0store/l0/internal/varint"
)

// The segment format. Changing any of these changes the on-disk format.
//
// A segment is a file of groups. A group is what one write and one fdatasync of the
// log put on disk: a header, then entries.
//
//	group header (32 bytes):
//	+-------+---------+-----------+-----------+-----------+----------+
//	| magic | CRC-32C | segment   | sequence  | length    | flags    |
//	| "l0wg"| of the  | uint64 BE | uint64 BE | uint32 BE | uint32 BE|
//	|       | 24 after|           |           | (entries) | 1: last  |
//	+-------+---------+-----------+-----------+-----------+----------+
//
//	entry:
//	+------+-----------+--------------------------------------------+
//	| kind | length    | body, which ends with its own CRC-32C      |
//	| byte | uint32 BE |                                            |
//	+------+-----------+--------------------------------------------+
//
//	page       'p'  body: page key | page value (format.go; its CRC covers both)
//	floor      'f'  body: uvarint id length | id | floor uint64 BE | CRC
//	reset      'r'  body: the same, a floor that also drops every earlier page
//	epoch      'o'  body: uvarint id length | id | epoch uint64 BE | CRC
//	checkpoint 'c'  body: count uint32 BE | (uvarint id length | id | epoch uint64 BE |
//	                floor uint64 BE) × count | CRC
//
// The CRCs of floor, reset, epoch and checkpoint entries cover the kind, the length
// and the body before them. Sequences number groups across segments, from 1; the
// segment number in the header is the file's own, so that the bytes a recycled file
// still holds from its previous use never read as its groups. The last group of a
// segment, flagged, is written before the next segment is created. The first group
// of every segment starts with a checkpoint: the epoch and floor of every shard the
// log knows, so that the segments before it can go.
const (
	segmentSuffix  = ".log"
	segmentDigits  = 16
	groupMagic     = "l0wg"
	groupHeaderLen = 4 + 4 + 8 + 8 + 4 + 4
	groupLast      = 1

	entryPage       = 'p'
	entryFloor      = 'f'
	entryReset      = 'r'
	entryEpoch      = 'o'
	entryCheckpoint = 'c'
	entryHeaderLen  = 1 + 4
)

func segmentName(num uint64) string {
	return fmt.Sprintf("%0*d%s", segmentDigits, num, segmentSuffix)
}

// parseSegmentName returns the number of a segment file's name.
func parseSegmentName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, segmentSuffix)
	if !ok || len(digits) != segmentDigits {
		return 0, false
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	return n, err == nil
}

type groupHeader struct {
	segment, seq uint64
	length       uint32
	flags        uint32
}

func putGroupHeader(b []byte, h groupHeader) {
	copy(b, groupMagic)
	binary.BigEndian.PutUint64(b[8:], h.segment)
	binary.BigEndian.PutUint64(b[16:], h.seq)
	binary.BigEndian.PutUint32(b[24:], h.length)
	binary.BigEndian.PutUint32(b[28:], h.flags)
	binary.BigEndian.PutUint32(b[4:], crc32.Checksum(b[8:groupHeaderLen], castagnoli))
}

// parseGroupHeader reads the group header at the start of b, if one is there.
func parseGroupHeader(b []byte) (groupHeader, bool) {
	if len(b) < groupHeaderLen || string(b[:4]) != groupMagic ||
		crc32.Checksum(b[8:groupHeaderLen], castagnoli) != binary.BigEndian.Uint32(b[4:]) {
		return groupHeader{}, false
	}
	return groupHeader{
		segment: binary.BigEndian.Uint64(b[8:]),
		seq:     binary.BigEndian.Uint64(b[16:]),
		length:  binary.BigEndian.Uint32(b[24:]),
		flags:   binary.BigEndian.Uint32(b[28:]),
	}, true
}

// nextGroupHeader returns the position in b of the first group header of segment
// seg with a sequence at or after seq, or -1.
func nextGroupHeader(b []byte, seg, seq uint64) int {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(groupMagic))
		if j < 0 {
			return -1
		}
		if h, ok := parseGroupHeader(b[i+j:]); ok && h.segment == seg && h.seq >= seq {
			return i + j
		}
		i += j + 1
	}
}

// appendPageEntry appends a page entry to dst and returns it with where the page's
// key and value start in it and how long they are.
func appendPageEntry(dst []byte, shard string, first uint64, at int64, recs [][]byte) (out []byte, at0 int, n int) {
	key := pageKey(shard, first)
	n = len(key) + pageLen(recs)
	dst = append(dst, entryPage)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	at0 = len(dst)
	dst = append(dst, key...)
	dst = encodePageAt(dst, key, at, recs)
	return dst, at0, n
}

// appendShardEntry appends a floor, reset or epoch entry.
func appendShardEntry(dst []byte, kind byte, shard string, v uint64) []byte {
	start := len(dst)
	n := uvarintLen(uint64(len(shard))) + len(shard) + 8 + crcLen
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = binary.AppendUvarint(dst, uint64(len(shard)))
	dst = append(dst, shard...)
	dst = binary.BigEndian.AppendUint64(dst, v)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// checkpointed is one shard's line of a checkpoint.
type checkpointed struct {
	shard        string
	epoch, floor uint64
}

func appendCheckpoint(dst []byte, lines []checkpointed) []byte {
	start := len(dst)
	dst = append(dst, entryCheckpoint, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(lines)))
	for _, c := range lines {
		dst = binary.AppendUvarint(dst, uint64(len(c.shard)))
		dst = append(dst, c.shard...)
		dst = binary.BigEndian.AppendUint64(dst, c.epoch)
		dst = binary.BigEndian.AppendUint64(dst, c.floor)
	}
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-entryHeaderLen+crcLen))
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// entry is one decoded entry of a group.
type entry struct {
	kind  byte
	shard string
	v     uint64 // floor or epoch

	// A page: its header, and where its key and value are in the group's body.
	first uint64
	page  pageHeader
	at, n int

	lines []checkpointed
}

// decodeEntries decodes and checks every entry of a group's body.
func decodeEntries(body []byte) ([]entry, error) {
	var out []entry
	for pos := 0; pos < len(body); {
		if len(body)-pos < entryHeaderLen {
			return nil, fmt.Errorf("entry at %d: %d bytes, shorter than its header", pos, len(body)-pos)
		}
		kind := body[pos]
		n := int(binary.BigEndian.Uint32(body[pos+1:]))
		if n > len(body)-pos-entryHeaderLen {
			return nil, fmt.Errorf("entry at %d: length %d past the group's end", pos, n)
		}
		e, err := decodeEntry(kind, body[pos:pos+entryHeaderLen+n])
		if err != nil {
			return nil, fmt.Errorf("entry at %d: %w", pos, err)
		}
		e.at += pos
		out = append(out, e)
		pos += entryHeaderLen + n
	}
	return out, nil
}

// decodeEntry decodes one entry, b, from its kind byte on.
func decodeEntry(kind byte, b []byte) (entry, error) {
	body := b[entryHeaderLen:]
	if kind == entryPage {
		shard, first, ok := splitPageKey(body)
		if !ok {
			return entry{}, fmt.Errorf("a page with no page key")
		}
		v := body[pageKeyLen(shard):]
		h, err := decodeHeader(shard, first, v)
		if err != nil {
			return entry{}, err
		}
		if err := checkPageCRC(shard, first, v); err != nil {
			return entry{}, err
		}
		return entry{kind: kind, shard: shard, first: first, page: h, at: entryHeaderLen, n: len(body)}, nil
	}
	if len(body) < crcLen || crc32.Checksum(b[:len(b)-crcLen], castagnoli) != binary.BigEndian.Uint32(b[len(b)-crcLen:]) {
		return entry{}, fmt.Errorf("entry of kind %q: checksum mismatch", kind)
	}
	body = body[:len(body)-crcLen]
	switch kind {
	case entryFloor, entryReset, entryEpoch:
		shard, rest, ok := cutID(body)
		if !ok || len(rest) != 8 {
			return entry{}, fmt.Errorf("entry of kind %q: malformed", kind)
		}
		return entry{kind: kind, shard: shard, v: binary.BigEndian.Uint64(rest)}, nil
	case entryCheckpoint:
		if len(body) < 4 {
			return entry{}, fmt.Errorf("checkpoint: malformed")
		}
		count, rest := binary.BigEndian.Uint32(body), body[4:]
		if uint64(count) > uint64(len(rest))/17 {
			return entry{}, fmt.Errorf("checkpoint: %d shards in %d bytes", count, len(rest))
		}
		lines := make([]checkpointed, 0, count)
		for range count {
			shard, r, ok := cutID(rest)
			if !ok || len(r) < 16 {
				return entry{}, fmt.Errorf("checkpoint: malformed")
			}
			lines = append(lines, checkpointed{shard, binary.BigEndian.Uint64(r), binary.BigEndian.Uint64(r[8:])})
			rest = r[16:]
		}
		if len(rest) != 0 {
			return entry{}, fmt.Errorf("checkpoint: trailing bytes")
		}
		return entry{kind: kind, lines: lines}, nil
	}
	return entry{}, fmt.Errorf("unknown entry kind %q", kind)
}

// cutID splits a uvarint-length-prefixed shard id off b.
func cutID(b []byte) (string, []byte, bool) {
	l, k := varint.Uvarint(b)
	if k <= 0 || l > uint64(len(b)-k) {
		return "", nil, false
	}
	return string(b[k : k+int(l)]), b[k+int(l):], true
}

// splitPageKey reads the page key at the start of b: the id runs to the first 0x00.
func splitPageKey(b []byte) (shard string, first uint64, ok bool) {
	if len(b) < 1+1+8 || b[0] != pagePrefix {
		return "", 0, false
	}
	sep := bytes.IndexByte(b[1:], separator)
	if sep < 0 || len(b) < 1+sep+1+8 {
		return "", 0, false
	}
	return parsePageKey(b[:1+sep+1+8])
}
