package part

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"iter"
	"sort"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/l0store/l0/internal/varint"
)

// Record is one record of a part and its offset.
type Record struct {
	Offset uint64
	Value  []byte
}

// NewDecoder returns a decoder for Open, for concurrency readers at once (0 means
// GOMAXPROCS). It decodes a block into no more than the buffer the reader sizes to
// the block's raw length: a frame that would decode to more fails instead of growing
// the buffer.
func NewDecoder(concurrency int) (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(concurrency), zstd.WithDecoderMaxMemory(MaxBlockRaw),
		zstd.WithDecodeAllCapLimit(true))
}

// defaultDecoder serves readers opened without a decoder; zstd decoders are safe for
// concurrent DecodeAll.
var defaultDecoder = sync.OnceValues(func() (*zstd.Decoder, error) { return NewDecoder(0) })

// Reader reads a part through an io.ReaderAt: its index at Open, then the blocks a
// read needs.
type Reader struct {
	r     io.ReaderAt
	size  int64
	name  string
	dec   *zstd.Decoder
	info  Info
	index []blockEntry
	// head is the header and tail the index and the footer up to the part CRC: the
	// bytes before and after the blocks that the part CRC covers.
	head, tail []byte
}

// Open reads and checks the header, footer and index of the part of size bytes in r.
// The name (the object key) is what errors call the part. A decoder must come from
// NewDecoder, which keeps a block from decoding to more than its raw length; nil
// means a shared one.
func Open(r io.ReaderAt, size int64, name string, dec *zstd.Decoder) (*Reader, error) {
	pr := &Reader{r: r, size: size, name: name, dec: dec}
	if pr.dec == nil {
		var err error
		if pr.dec, err = defaultDecoder(); err != nil {
			return nil, err
		}
	}
	if err := pr.open(); err != nil {
		return nil, err
	}
	return pr, nil
}

func (pr *Reader) corrupt(pos int64, format string, args ...any) error {
	return &CorruptionError{Part: pr.name, Pos: pos, Reason: fmt.Sprintf(format, args...)}
}

func (pr *Reader) readAt(pos int64, n int) ([]byte, error) {
	b := make([]byte, n)
	m, err := pr.r.ReadAt(b, pos)
	if m == n {
		return b, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return nil, pr.corrupt(pos+int64(m), "%d bytes where %d were expected", m, n)
	}
	return nil, fmt.Errorf("part %s: read %d bytes at %d: %w", pr.name, n, pos, err)
}

func (pr *Reader) open() error {
	if pr.size < headerLen+footerLen {
		return pr.corrupt(0, "%d bytes, shorter than a header and a footer", pr.size)
	}
	h, err := pr.readAt(0, headerLen)
	if err != nil {
		return err
	}
	pr.head = h
	if string(h[:len(headerMagic)]) != headerMagic {
		return pr.corrupt(0, "no part header")
	}
	if h[len(headerMagic)] != version {
		return fmt.Errorf("part %s: version %d: %w", pr.name, h[len(headerMagic)], ErrUnknownVersion)
	}
	fpos := pr.size - footerLen
	ft, err := pr.readAt(fpos, footerLen)
	if err != nil {
		return err
	}
	if string(ft[footerLen-len(footerMagic):]) != footerMagic {
		return pr.corrupt(fpos, "no part footer")
	}
	if got, want := crc32.Checksum(ft[:footerCRCPos], castagnoli), binary.BigEndian.Uint32(ft[footerCRCPos:]); got != want {
		return pr.corrupt(fpos, "footer checksum %08x, want %08x", got, want)
	}
	if v := ft[footerCRCPos+4]; v != version {
		return fmt.Errorf("part %s: footer version %d: %w", pr.name, v, ErrUnknownVersion)
	}
	indexPos := int64(binary.BigEndian.Uint64(ft))
	indexLen := int64(binary.BigEndian.Uint32(ft[8:]))
	pr.info.Count = binary.BigEndian.Uint64(ft[12:])
	pr.info.RawBytes = binary.BigEndian.Uint64(ft[20:])
	pr.info.CRC = binary.BigEndian.Uint32(ft[28:])
	pr.info.Size = pr.size
	maxIndex := int64(1+MaxShardIDLen+8+4+4) + MaxBlocks*indexEntryLen
	if indexPos < headerLen || indexLen > maxIndex || indexPos+indexLen != fpos {
		return pr.corrupt(fpos, "index at %d of %d bytes does not end at the footer", indexPos, indexLen)
	}
	idx, err := pr.readAt(indexPos, int(indexLen))
	if err != nil {
		return err
	}
	if err := pr.parseIndex(indexPos, idx); err != nil {
		return err
	}
	pr.tail = append(idx, ft[:footerCRCPos-4]...)
	return nil
}

func (pr *Reader) parseIndex(pos int64, idx []byte) error {
	if len(idx) < 1+4 {
		return pr.corrupt(pos, "index of %d bytes", len(idx))
	}
	body := idx[:len(idx)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.BigEndian.Uint32(idx[len(body):]); got != want {
		return pr.corrupt(pos, "index checksum %08x, want %08x", got, want)
	}
	idLen := int(body[0])
	if idLen == 0 || len(body) < 1+idLen+8+4 {
		return pr.corrupt(pos, "index header")
	}
	pr.info.Shard = string(body[1 : 1+idLen])
	rest := body[1+idLen:]
	pr.info.First = binary.BigEndian.Uint64(rest)
	n := binary.BigEndian.Uint32(rest[8:])
	rest = rest[12:]
	if n == 0 || n > MaxBlocks || len(rest) != int(n)*indexEntryLen {
		return pr.corrupt(pos, "%d blocks in an index of %d entry bytes", n, len(rest))
	}
	pr.index = make([]blockEntry, n)
	next, at := pr.info.First, uint64(headerLen)
	var records, raw uint64
	for i := range pr.index {
		b := parseBlockEntry(rest[i*indexEntryLen:])
		switch {
		case b.first != next:
			return pr.corrupt(pos, "block %d starts at offset %d, want %d", i, b.first, next)
		case b.pos != at:
			return pr.corrupt(pos, "block %d at byte %d, want %d", i, b.pos, at)
		// A record takes at least its length byte, so a block holds no more records
		// than raw bytes; and its stored bytes bound what it can decode to.
		case b.records == 0 || b.stored == 0 || b.raw > MaxBlockRaw || uint64(b.records) > uint64(b.raw) ||
			uint64(b.raw) > uint64(b.stored)*maxExpansion:
			return pr.corrupt(pos, "block %d: %d records, %d stored bytes, %d raw", i, b.records, b.stored, b.raw)
		}
		pr.index[i] = b
		next += uint64(b.records)
		at += uint64(b.stored)
		records += uint64(b.records)
		raw += uint64(b.raw)
	}
	if at != uint64(pos) || records != pr.info.Count || raw < pr.info.RawBytes {
		return pr.corrupt(pos, "blocks end at %d with %d records, footer says index at %d, %d records", at, records, pos, pr.info.Count)
	}
	pr.info.Blocks = len(pr.index)
	return nil
}

// Info describes the part, as its footer and index say.
func (pr *Reader) Info() Info { return pr.info }

// Records iterates over the part's records from offset from (or its first). It
// reads and decodes only the blocks from the one holding from. A read from the
// part's first record to the end also checks the part CRC, so it verifies every
// byte. Values are the caller's to keep.
func (pr *Reader) Records(from uint64) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		start := sort.Search(len(pr.index), func(i int) bool {
			b := pr.index[i]
			return b.first+uint64(b.records) > from
		})
		whole := start == 0
		crc := crc32.New(castagnoli)
		if whole {
			crc.Write(pr.head)
		}
		for i := start; i < len(pr.index); i++ {
			b := pr.index[i]
			stored, err := pr.readAt(int64(b.pos), int(b.stored))
			if err != nil {
				yield(Record{}, err)
				return
			}
			if whole {
				crc.Write(stored)
			}
			raw, err := pr.decodeBlock(i, stored)
			if err != nil {
				yield(Record{}, err)
				return
			}
			// Records are cut from the block as they are yielded, not gathered first:
			// a record may be a single byte, so a slice of them could take many times
			// the block.
			for off := b.first; len(raw) > 0; off++ {
				var v []byte
				v, raw, _ = cutRecord(raw) // decodeBlock checked every length
				if off < from {
					continue
				}
				if !yield(Record{Offset: off, Value: v}, nil) {
					return
				}
			}
		}
		if whole {
			crc.Write(pr.tail)
			if got := crc.Sum32(); got != pr.info.CRC {
				yield(Record{}, pr.corrupt(pr.size-footerLen, "part checksum %08x, want %08x", got, pr.info.CRC))
			}
		}
	}
}

// decodeBlock checks block i's stored bytes and decodes them. It returns the raw
// block only once it has found exactly the index's count of records in it and
// nothing after them, so a block's records are yielded whole or not at all.
func (pr *Reader) decodeBlock(i int, stored []byte) ([]byte, error) {
	b := pr.index[i]
	pos := int64(b.pos)
	if got := crc32.Checksum(stored, castagnoli); got != b.crc {
		return nil, pr.corrupt(pos, "block %d checksum %08x, want %08x", i, got, b.crc)
	}
	raw, err := pr.dec.DecodeAll(stored, make([]byte, 0, b.raw))
	if err != nil {
		return nil, pr.corrupt(pos, "block %d: %v", i, err)
	}
	if len(raw) != int(b.raw) {
		return nil, pr.corrupt(pos, "block %d decodes to %d bytes, want %d", i, len(raw), b.raw)
	}
	n, rest := 0, raw
	for len(rest) > 0 && n < int(b.records) {
		var ok bool
		if _, rest, ok = cutRecord(rest); !ok {
			return nil, pr.corrupt(pos, "block %d: record %d: bad length", i, n)
		}
		n++
	}
	if n != int(b.records) || len(rest) != 0 {
		return nil, pr.corrupt(pos, "block %d holds %d records and %d stray bytes, want %d records", i, n, len(rest), b.records)
	}
	return raw, nil
}

// cutRecord splits the record at the start of raw from the rest. The record's
// capacity ends with it, so a caller appending to it cannot overwrite the next.
func cutRecord(raw []byte) (rec, rest []byte, ok bool) {
	n, k := varint.Uvarint(raw)
	if k <= 0 || n > uint64(len(raw)-k) {
		return nil, raw, false
	}
	end := k + int(n)
	return raw[k:end:end], raw[end:], true
}

// Verify reads the whole part and checks every checksum.
func (pr *Reader) Verify() error {
	for _, err := range pr.Records(pr.info.First) {
		if err != nil {
			return err
		}
	}
	return nil
}
