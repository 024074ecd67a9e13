package part

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// The part format. Changing any of these changes the on-disk format.
const (
	headerMagic = "l0prt"
	footerMagic = "l0part\x00"
	version     = 1

	headerLen     = 8
	footerLen     = 8 + 4 + 8 + 8 + 4 + 4 + 1 + 7 // the last 7: footerMagic
	indexEntryLen = 8 + 4 + 8 + 4 + 4 + 4

	// DefaultBlockSize is the raw size at which a block is cut.
	DefaultBlockSize = 64 << 10
	// MaxBlockRaw, MaxBlocks and MaxShardIDLen bound what a reader allocates when a
	// length field is corrupt. A block holds at least one record, so MaxBlockRaw
	// also bounds the record size.
	MaxBlockRaw   = 128 << 20
	MaxBlocks     = 1 << 22
	MaxShardIDLen = 255
)

// maxExpansion is the most a zstd frame can decode to per stored byte: a block of
// zstd holds at most 128 KiB and takes at least 4 bytes (a 3-byte header and one
// repeated byte). A block whose index claims a raw length its stored bytes cannot
// decode to is corrupt, so what the reader allocates for a block is bounded by the
// bytes it read as well as by MaxBlockRaw.
const maxExpansion = (128 << 10) / 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorrupt reports a part that fails its checks. Errors that wrap it are
	// *CorruptionError and say where.
	ErrCorrupt = errors.New("part: corrupt")
	// ErrUnknownVersion reports a part written by a newer format version.
	ErrUnknownVersion = errors.New("part: unknown format version")
	// ErrEmptyRecord reports an empty record given to a Writer. l0 refuses them at
	// append; the reader copes with them, but a block of them costs far more to read
	// than to store.
	ErrEmptyRecord = errors.New("part: empty record")
)

// CorruptionError says which part failed which check, and where.
type CorruptionError struct {
	Part   string // the name the reader was opened with: the object key
	Pos    int64  // byte position in the part
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("part %s: corrupt at byte %d: %s", e.Part, e.Pos, e.Reason)
}

func (e *CorruptionError) Unwrap() error { return ErrCorrupt }

// blockEntry is one block's line in the index.
type blockEntry struct {
	first   uint64 // offset of the block's first record
	records uint32
	pos     uint64 // byte position of the block in the part
	stored  uint32 // compressed length
	raw     uint32 // decompressed length
	crc     uint32 // CRC-32C of the stored bytes
}

func (b blockEntry) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, b.first)
	dst = binary.BigEndian.AppendUint32(dst, b.records)
	dst = binary.BigEndian.AppendUint64(dst, b.pos)
	dst = binary.BigEndian.AppendUint32(dst, b.stored)
	dst = binary.BigEndian.AppendUint32(dst, b.raw)
	return binary.BigEndian.AppendUint32(dst, b.crc)
}

func parseBlockEntry(b []byte) blockEntry {
	return blockEntry{
		first:   binary.BigEndian.Uint64(b),
		records: binary.BigEndian.Uint32(b[8:]),
		pos:     binary.BigEndian.Uint64(b[12:]),
		stored:  binary.BigEndian.Uint32(b[20:]),
		raw:     binary.BigEndian.Uint32(b[24:]),
		crc:     binary.BigEndian.Uint32(b[28:]),
	}
}

// footer is the part's last footerLen bytes.
type footer struct {
	indexPos uint64
	indexLen uint32
	records  uint64
	rawBytes uint64
	partCRC  uint32
}

func (f footer) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, f.indexPos)
	dst = binary.BigEndian.AppendUint32(dst, f.indexLen)
	dst = binary.BigEndian.AppendUint64(dst, f.records)
	dst = binary.BigEndian.AppendUint64(dst, f.rawBytes)
	return binary.BigEndian.AppendUint32(dst, f.partCRC)
}

// footerCRCPos is where the footer CRC sits in the footer; the part CRC is just
// before it.
const footerCRCPos = 8 + 4 + 8 + 8 + 4

// crcTail is how many bytes at a part's end the part CRC does not cover: the part
// CRC itself and what follows it in the footer.
const crcTail = footerLen - (footerCRCPos - 4)

// Checksum reads r, which holds a part of size bytes, to its end and returns how
// many bytes it held and the part CRC of the first size-crcTail of them (see
// doc.go): what a copier compares with the size and CRC a manifest records, without
// parsing the part.
func Checksum(r io.Reader, size int64) (n int64, crc uint32, err error) {
	h := crc32.New(castagnoli)
	n, err = io.Copy(h, io.LimitReader(r, max(0, size-crcTail)))
	if err != nil {
		return n, 0, err
	}
	rest, err := io.Copy(io.Discard, r)
	return n + rest, h.Sum32(), err
}
