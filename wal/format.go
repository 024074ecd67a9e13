package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/l0store/l0/internal/varint"
)

// The page format. Changing any of these changes the on-disk format.
const (
	pageVersion = 1

	pagePrefix = 'p'
	separator  = 0x00

	// pageHeaderLen is version, count, appended-at and payload bytes.
	pageHeaderLen = 1 + 4 + 8 + 8
	crcLen        = 4

	// MaxPageRecords and MaxRecordLen bound what a decoder allocates when a length
	// field is corrupt; the engine's own limits are lower.
	MaxPageRecords = 1 << 24
	MaxRecordLen   = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorrupt reports stored bytes that fail their checks. Errors that wrap it are
	// *CorruptionError and say where.
	ErrCorrupt = errors.New("wal: corrupt page")
	// ErrTruncated reports a read from an offset that was truncated (sealed) away.
	ErrTruncated = errors.New("wal: offset truncated")
	// ErrClosed reports use of a Log after Close.
	ErrClosed = errors.New("wal: closed")
	// ErrEmptyBatch reports an append of no records.
	ErrEmptyBatch = errors.New("wal: empty batch")
	// ErrNotPageBoundary reports a truncation point inside a page.
	ErrNotPageBoundary = errors.New("wal: not a page boundary")
	// ErrStaleEpoch reports an append or truncation by an owner whose epoch is no
	// longer the shard's: a newer owner opened the shard on this log. SetEpoch
	// reports it for an epoch below the shard's.
	ErrStaleEpoch = errors.New("wal: stale owner epoch")
	// ErrUnknownOutcome reports an append that entered the log but whose write or
	// sync failed, or whose page was not shipped (see Log.ShipTo): its page may be
	// durable, and may be read back after a reopen. After a failed write or sync
	// the Log refuses every later call; after a failed shipment it does not.
	ErrUnknownOutcome = errors.New("wal: append outcome unknown")
	// ErrFailed reports a call refused because an earlier write or sync failed:
	// it wrote nothing.
	ErrFailed = errors.New("wal: failed earlier")
	// ErrFormat reports a directory that holds a log of a format this version does
	// not read.
	ErrFormat = errors.New("wal: log of another format")
)

// CorruptionError says which page failed its checks and why.
type CorruptionError struct {
	Shard  string
	Offset uint64 // the page's first offset, as its key says
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("wal: corrupt page of shard %q at offset %d: %s", e.Shard, e.Offset, e.Reason)
}

func (e *CorruptionError) Unwrap() error { return ErrCorrupt }

// Page is one append's records with the offset of the first.
type Page struct {
	Shard       string
	FirstOffset uint64
	AppendedAt  time.Time
	Records     [][]byte
}

// NextOffset is the offset after the page's last record.
func (p Page) NextOffset() uint64 { return p.FirstOffset + uint64(len(p.Records)) }

// pageKeyLen is the length of the shard's page keys.
func pageKeyLen(shard string) int { return 1 + len(shard) + 1 + 8 }

func pageKey(shard string, first uint64) []byte {
	k := make([]byte, 0, pageKeyLen(shard))
	k = append(append(append(k, pagePrefix), shard...), separator)
	return binary.BigEndian.AppendUint64(k, first)
}

// parsePageKey splits a page key into shard and first offset.
func parsePageKey(k []byte) (shard string, first uint64, ok bool) {
	if len(k) < 1+1+8 || k[0] != pagePrefix || k[len(k)-9] != separator {
		return "", 0, false
	}
	return string(k[1 : len(k)-9]), binary.BigEndian.Uint64(k[len(k)-8:]), true
}

// pageLen is the length of the value of a page of recs.
func pageLen(recs [][]byte) int {
	n := pageHeaderLen + crcLen
	for _, r := range recs {
		n += uvarintLen(uint64(len(r))) + len(r)
	}
	return n
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// encodePage appends the value of a page to dst; with pageLen(recs) bytes of capacity
// it does so in place.
func encodePage(dst []byte, shard string, first uint64, at time.Time, recs [][]byte) []byte {
	return encodePageAt(dst, pageKey(shard, first), at.UnixNano(), recs)
}

// encodePageAt is encodePage with the page's key, and its time in Unix nanoseconds.
func encodePageAt(dst, key []byte, at int64, recs [][]byte) []byte {
	var payload uint64
	for _, r := range recs {
		payload += uint64(len(r))
	}
	start := len(dst)
	dst = append(dst, pageVersion)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(recs)))
	dst = binary.BigEndian.AppendUint64(dst, uint64(at))
	dst = binary.BigEndian.AppendUint64(dst, payload)
	for _, r := range recs {
		dst = binary.AppendUvarint(dst, uint64(len(r)))
		dst = append(dst, r...)
	}
	crc := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, dst[start:])
	return binary.BigEndian.AppendUint32(dst, crc)
}

// checkPageCRC verifies the checksum of a page value found under the shard's page
// key at first.
func checkPageCRC(shard string, first uint64, v []byte) error {
	if len(v) < crcLen {
		return &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("%d bytes, shorter than a checksum", len(v))}
	}
	body := v[:len(v)-crcLen]
	want := binary.BigEndian.Uint32(v[len(v)-crcLen:])
	if got := crc32.Update(crc32.Checksum(pageKey(shard, first), castagnoli), castagnoli, body); got != want {
		return &CorruptionError{Shard: shard, Offset: first, Reason: fmt.Sprintf("checksum %08x, want %08x", got, want)}
	}
	return nil
}

// pageHeader is what the header alone says of a page.
type pageHeader struct {
	count      int
	appendedAt time.Time
	payload    uint64
}

func decodeHeader(shard string, first uint64, v []byte) (pageHeader, error) {
	corrupt := func(reason string) error { return &CorruptionError{Shard: shard, Offset: first, Reason: reason} }
	if len(v) < pageHeaderLen+crcLen {
		return pageHeader{}, corrupt(fmt.Sprintf("%d bytes, shorter than a header", len(v)))
	}
	if v[0] != pageVersion {
		return pageHeader{}, corrupt(fmt.Sprintf("unknown version %d", v[0]))
	}
	count := binary.BigEndian.Uint32(v[1:])
	if count == 0 || count > MaxPageRecords {
		return pageHeader{}, corrupt(fmt.Sprintf("record count %d", count))
	}
	return pageHeader{
		count:      int(count),
		appendedAt: time.Unix(0, int64(binary.BigEndian.Uint64(v[5:]))),
		payload:    binary.BigEndian.Uint64(v[13:]),
	}, nil
}

// decodePage verifies a page value and returns its records, which alias v.
func decodePage(shard string, first uint64, v []byte) (Page, error) {
	corrupt := func(reason string) error { return &CorruptionError{Shard: shard, Offset: first, Reason: reason} }
	h, err := decodeHeader(shard, first, v)
	if err != nil {
		return Page{}, err
	}
	if err := checkPageCRC(shard, first, v); err != nil {
		return Page{}, err
	}
	body := v[:len(v)-crcLen]
	rest := body[pageHeaderLen:]
	// Each record takes at least its one-byte length: a count the bytes cannot hold
	// must not size the allocation.
	recs := make([][]byte, 0, min(h.count, len(rest)))
	var payload uint64
	for range h.count {
		n, l := varint.Uvarint(rest)
		if l <= 0 || n > MaxRecordLen || n > uint64(len(rest)-l) {
			return Page{}, corrupt(fmt.Sprintf("record %d: bad length", len(recs)))
		}
		// Capped: a caller that appends to a record it keeps must get new memory,
		// not write over the records after it.
		recs = append(recs, rest[l:l+int(n):l+int(n)])
		rest = rest[l+int(n):]
		payload += n
	}
	if len(rest) != 0 || payload != h.payload {
		return Page{}, corrupt("records do not fill the page")
	}
	return Page{Shard: shard, FirstOffset: first, AppendedAt: h.appendedAt, Records: recs}, nil
}
