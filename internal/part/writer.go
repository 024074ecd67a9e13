package part

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"

	"github.com/klauspost/compress/zstd"
)

// Options configure a Writer.
type Options struct {
	// BlockSize is the raw size at which a block is cut. Default 64 KiB: zstd keeps
	// most of its ratio at that size while a read from a mid-part offset decodes
	// little more than it needs.
	BlockSize int
	// Encoder compresses the blocks; it may be shared by concurrent writers (only
	// its EncodeAll is used). Nil means NewEncoder(BlockSize, 1).
	Encoder *zstd.Encoder
}

// NewEncoder returns the encoder parts use, at zstd.SpeedFastest, for concurrency
// writers at once. Each block is a zstd frame of its own, so the window need not
// reach past a block: it is sized to twice blockSize, which keeps each encoder's
// history at about a megabyte where zstd's default window would take 16 MB.
func NewEncoder(blockSize, concurrency int) (*zstd.Encoder, error) {
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	window := zstd.MinWindowSize
	for window < 2*blockSize && window < zstd.MaxWindowSize {
		window *= 2
	}
	return zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(concurrency),
		zstd.WithWindowSize(window))
}

// Info describes a written part.
type Info struct {
	Shard    string
	First    uint64 // offset of the first record
	Count    uint64 // records
	RawBytes uint64 // record bytes, uncompressed
	Size     int64  // bytes of the part
	CRC      uint32 // the part CRC (see doc.go)
	Blocks   int
}

// Next is the offset after the part's last record.
func (i Info) Next() uint64 { return i.First + i.Count }

// Writer streams a part to an io.Writer, one block at a time: it holds at most one
// raw and one compressed block in memory.
type Writer struct {
	w     io.Writer
	opts  Options
	info  Info
	crc   hash.Hash32
	pos   int64
	raw   []byte // the block being filled
	n     uint32 // records in it
	buf   []byte // its compressed form, reused
	index []blockEntry
	err   error // sticky
}

// NewWriter starts a part of shard whose first record gets offset first.
func NewWriter(w io.Writer, shard string, first uint64, opts Options) *Writer {
	if opts.BlockSize <= 0 {
		opts.BlockSize = DefaultBlockSize
	}
	pw := &Writer{w: w, opts: opts, info: Info{Shard: shard, First: first}, crc: crc32.New(castagnoli)}
	switch {
	case len(shard) == 0 || len(shard) > MaxShardIDLen:
		pw.err = fmt.Errorf("part: shard id of %d bytes", len(shard))
	case opts.Encoder == nil:
		pw.opts.Encoder, pw.err = NewEncoder(opts.BlockSize, 1)
	}
	if pw.err == nil {
		pw.write(append([]byte(headerMagic), version, 0, 0))
	}
	return pw
}

// Add appends a record. An empty record is refused (ErrEmptyRecord) and leaves the
// part as it was.
func (pw *Writer) Add(rec []byte) error {
	if pw.err != nil {
		return pw.err
	}
	if len(rec) == 0 {
		return ErrEmptyRecord
	}
	if len(rec) > MaxBlockRaw-binary.MaxVarintLen32 {
		return fmt.Errorf("part: record of %d bytes", len(rec))
	}
	if len(pw.raw) > 0 && len(pw.raw)+len(rec)+binary.MaxVarintLen32 > MaxBlockRaw {
		pw.flush()
	}
	pw.raw = binary.AppendUvarint(pw.raw, uint64(len(rec)))
	pw.raw = append(pw.raw, rec...)
	pw.n++
	pw.info.Count++
	pw.info.RawBytes += uint64(len(rec))
	if len(pw.raw) >= pw.opts.BlockSize {
		pw.flush()
	}
	return pw.err
}

// flush writes the block being filled.
func (pw *Writer) flush() {
	if pw.n == 0 || pw.err != nil {
		return
	}
	if len(pw.index) == MaxBlocks {
		pw.err = errors.New("part: too many blocks")
		return
	}
	stored := pw.opts.Encoder.EncodeAll(pw.raw, pw.buf[:0])
	pw.buf = stored
	pw.index = append(pw.index, blockEntry{
		first:   pw.info.Next() - uint64(pw.n),
		records: pw.n,
		pos:     uint64(pw.pos),
		stored:  uint32(len(stored)),
		raw:     uint32(len(pw.raw)),
		crc:     crc32.Checksum(stored, castagnoli),
	})
	pw.write(stored)
	pw.raw, pw.n = pw.raw[:0], 0
}

// write writes b, checksummed before it is handed over: a writer may scribble on
// its input once it returns (pebble's in-memory file system does, in race and
// invariant builds, to flush out callers that reuse it), and a short write fails
// the part anyway.
func (pw *Writer) write(b []byte) {
	if pw.err != nil {
		return
	}
	pw.crc.Write(b)
	n, err := pw.w.Write(b)
	pw.pos += int64(n)
	pw.err = err
	if err == nil && n != len(b) {
		pw.err = io.ErrShortWrite
	}
}

// Close writes the last block, the index and the footer. The part must hold at
// least one record.
func (pw *Writer) Close() (Info, error) {
	if pw.err == nil && pw.info.Count == 0 {
		pw.err = errors.New("part: no records")
	}
	pw.flush()
	if pw.err != nil {
		return Info{}, pw.err
	}
	idx := []byte{byte(len(pw.info.Shard))}
	idx = append(idx, pw.info.Shard...)
	idx = binary.BigEndian.AppendUint64(idx, pw.info.First)
	idx = binary.BigEndian.AppendUint32(idx, uint32(len(pw.index)))
	for _, b := range pw.index {
		idx = b.append(idx)
	}
	idx = binary.BigEndian.AppendUint32(idx, crc32.Checksum(idx, castagnoli))
	indexPos := pw.pos
	pw.write(idx)

	f := footer{indexPos: uint64(indexPos), indexLen: uint32(len(idx)), records: pw.info.Count, rawBytes: pw.info.RawBytes}
	ft := f.append(nil)
	ft = ft[:footerCRCPos-4] // the part CRC covers everything before it
	pw.crc.Write(ft)
	partCRC := pw.crc.Sum32()
	ft = binary.BigEndian.AppendUint32(ft, partCRC)
	ft = binary.BigEndian.AppendUint32(ft, crc32.Checksum(ft, castagnoli))
	ft = append(ft, version)
	ft = append(ft, footerMagic...)
	if pw.err == nil {
		_, pw.err = pw.w.Write(ft)
	}
	if pw.err != nil {
		return Info{}, pw.err
	}
	pw.pos += int64(len(ft))
	pw.info.Size, pw.info.CRC, pw.info.Blocks = pw.pos, partCRC, len(pw.index)
	return pw.info, nil
}
