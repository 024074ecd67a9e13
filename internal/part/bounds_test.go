package part

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"runtime"
	"testing"
)

// craftedBlock is a block as a hostile writer would put it in a part: any stored
// bytes, and any record count and raw length in its index entry.
type craftedBlock struct {
	stored  []byte
	records uint32
	raw     uint32
}

// craft lays out a part of shard s holding blocks as given, with every checksum
// valid: what the reader must survive once the checksums no longer stop it.
func craft(blocks ...craftedBlock) []byte {
	data := append([]byte(headerMagic), version, 0, 0)
	idx := append([]byte{1}, 's')
	idx = binary.BigEndian.AppendUint64(idx, 0)
	idx = binary.BigEndian.AppendUint32(idx, uint32(len(blocks)))
	var count, raw uint64
	for _, b := range blocks {
		e := blockEntry{first: count, records: b.records, pos: uint64(len(data)), stored: uint32(len(b.stored)), raw: b.raw}
		idx = e.append(idx)
		data = append(data, b.stored...)
		count += uint64(b.records)
		raw += uint64(b.raw)
	}
	idx = binary.BigEndian.AppendUint32(idx, 0)
	f := footer{indexPos: uint64(len(data)), indexLen: uint32(len(idx)), records: count, rawBytes: raw}
	data = append(data, idx...)
	data = f.append(data)
	data = binary.BigEndian.AppendUint32(data, 0)
	data = append(data, version)
	data = append(data, footerMagic...)
	reseal(data)
	return data
}

// reseal recomputes, in place, every checksum of data it can find: the blocks' the
// index names, the index's, the part's and the footer's. It changes nothing else, so
// a damaged length or count stays damaged but is no longer caught by a checksum.
func reseal(data []byte) {
	if len(data) < headerLen+footerLen {
		return
	}
	fpos := len(data) - footerLen
	ft := data[fpos:]
	ipos, ilen := binary.BigEndian.Uint64(ft), uint64(binary.BigEndian.Uint32(ft[8:]))
	if ipos >= headerLen && ilen >= 4 && ipos+ilen == uint64(fpos) {
		body := data[ipos : uint64(fpos)-4]
		if len(body) > 0 && len(body) >= 1+int(body[0])+12 {
			for es := body[1+int(body[0])+12:]; len(es) >= indexEntryLen; es = es[indexEntryLen:] {
				if e := parseBlockEntry(es); e.pos <= uint64(len(data)) && uint64(e.stored) <= uint64(len(data))-e.pos {
					binary.BigEndian.PutUint32(es[28:], crc32.Checksum(data[e.pos:e.pos+uint64(e.stored)], castagnoli))
				}
			}
		}
		binary.BigEndian.PutUint32(data[uint64(fpos)-4:], crc32.Checksum(body, castagnoli))
	}
	partCRC := fpos + footerCRCPos - 4
	binary.BigEndian.PutUint32(data[partCRC:], crc32.Checksum(data[:partCRC], castagnoli))
	binary.BigEndian.PutUint32(data[fpos+footerCRCPos:], crc32.Checksum(ft[:footerCRCPos], castagnoli))
}

// allocBound is what reading part data may allocate. The reader holds the header,
// the footer, the index twice (as read, and with the footer appended for the part
// CRC), the index parsed (a little more than its bytes) and the stored bytes of the
// blocks it reads: together under four times the part. On top of that it holds each
// block it decodes, which can be no longer than the index says nor than its stored
// bytes can decode to, and one megabyte for the decoder's own buffers (a zstd
// block's worth of them per decoder, and one block's overshoot past a frame that
// does not say its length).
func allocBound(data []byte, blocks []blockEntry) uint64 {
	bound := 4*uint64(len(data)) + 1<<20
	for _, b := range blocks {
		bound += min(uint64(b.raw), uint64(b.stored)*maxExpansion, MaxBlockRaw)
	}
	return bound
}

// allocated returns the bytes f allocated.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func zstdFrame(t testing.TB, raw []byte, withSize bool) []byte {
	t.Helper()
	enc, err := NewEncoder(DefaultBlockSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	if withSize {
		return enc.EncodeAll(raw, nil)
	}
	// A streamed frame does not record its content size.
	var buf bytes.Buffer
	enc.Reset(&buf)
	if _, err := enc.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestACraftedPartCannotMakeTheReaderAllocateMoreThanItsBytesHold(t *testing.T) {
	// 8 MiB of zero bytes is 8 Mi empty records in a part of a few KB: a reader
	// that gathers a block's records before yielding them allocates a slice header
	// per record, 24 times the block.
	const n = 8 << 20
	zeros := make([]byte, n)
	sized, unsized := zstdFrame(t, zeros, true), zstdFrame(t, zeros, false)
	small := zstdFrame(t, zeros[:100], true)
	for _, tc := range []struct {
		name    string
		block   craftedBlock
		last    bool // read only the last record
		corrupt bool
	}{
		{"empty records, read whole", craftedBlock{sized, n, n}, false, false},
		{"empty records, read from the last", craftedBlock{sized, n, n}, true, false},
		{"a frame longer than its raw length", craftedBlock{sized, 64 << 10, 64 << 10}, false, true},
		{"an unsized frame longer than its raw length", craftedBlock{unsized, 64 << 10, 64 << 10}, false, true},
		{"a raw length its stored bytes cannot hold", craftedBlock{small, 100, 64 << 20}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := craft(tc.block)
			// The shared decoder sets itself up on first use; that is not this part's.
			if err := openAndVerify(encodeRecords(t, records(3, 9))); err != nil {
				t.Fatal(err)
			}
			var err error
			var recs uint64
			got := allocated(func() {
				var r *Reader
				if r, err = Open(bytes.NewReader(data), int64(len(data)), partName, nil); err != nil {
					return
				}
				from := uint64(0)
				if tc.last {
					from = r.Info().Count - 1
				}
				for _, e := range r.Records(from) {
					if err = e; err != nil {
						return
					}
					recs++
				}
			})
			e := parseBlockEntry(craftedEntry(data))
			bound := allocBound(data, []blockEntry{e})
			t.Logf("part of %d bytes, block of %d stored, %d raw bytes: %d records read, %d bytes allocated (bound %d)",
				len(data), e.stored, e.raw, recs, got, bound)
			var ce *CorruptionError
			switch {
			case tc.corrupt && !errors.As(err, &ce):
				t.Fatalf("read: %v, want a CorruptionError", err)
			case !tc.corrupt && err != nil:
				t.Fatal(err)
			case !tc.corrupt && tc.last && recs != 1, !tc.corrupt && !tc.last && recs != n:
				t.Fatalf("%d records read", recs)
			}
			if got > bound {
				t.Fatalf("reading a part of %d bytes allocated %d bytes, more than its bytes hold (%d)", len(data), got, bound)
			}
		})
	}
}

// craftedEntry is the index entry of a crafted part's first block.
func craftedEntry(data []byte) []byte {
	ipos := binary.BigEndian.Uint64(data[len(data)-footerLen:])
	return data[ipos+1+1+8+4:]
}

func encodeRecords(t testing.TB, recs [][]byte) []byte {
	data, _ := encode(t, "s", 0, recs, Options{})
	return data
}

func openAndVerify(data []byte) error {
	r, err := Open(bytes.NewReader(data), int64(len(data)), partName, nil)
	if err != nil {
		return err
	}
	return r.Verify()
}

// FuzzDecodeWithValidChecksums reseals every input's checksums before reading it,
// so the fuzzer reaches what the checksums guard: the index's counts and lengths,
// the zstd frames and the records in them. No input may make the reader panic,
// fail with other than a CorruptionError or ErrUnknownVersion, yield a record out
// of order or after an error, stop short of the part's end without an error, or
// allocate more than its bytes hold.
func FuzzDecodeWithValidChecksums(f *testing.F) {
	for i, n := range []int{1, 5, 40} {
		data, _ := encode(f, "s", uint64(i*100), records(n, uint64(i)), Options{BlockSize: 1 << 10})
		f.Add(data, uint64(i*100+n/2))
	}
	tiny := make([][]byte, 300)
	for i := range tiny {
		tiny[i] = []byte{byte(i)}
	}
	data, _ := encode(f, "s", 0, tiny, Options{BlockSize: 128})
	f.Add(data, uint64(0))
	// Blocks of empty records, enough of them that a slice header each would break
	// the bound.
	f.Add(craft(craftedBlock{zstdFrame(f, make([]byte, 64<<10), true), 64 << 10, 64 << 10}), uint64(0))
	f.Add(craft(craftedBlock{zstdFrame(f, make([]byte, 64<<10), false), 64 << 10, 64 << 10}), uint64(1))
	f.Fuzz(func(t *testing.T, data []byte, from uint64) {
		data = bytes.Clone(data)
		reseal(data)
		var r *Reader
		var openErr, readErr error
		var info Info
		next := uint64(0)
		got := allocated(func() {
			if r, openErr = Open(bytes.NewReader(data), int64(len(data)), partName, nil); openErr != nil {
				return
			}
			info = r.Info()
			next = max(from, info.First)
			for rec, err := range r.Records(from) {
				if readErr != nil {
					t.Fatalf("record %d after %v", rec.Offset, readErr)
				}
				if readErr = err; err != nil {
					continue
				}
				if rec.Offset != next {
					t.Fatalf("offset %d, want %d", rec.Offset, next)
				}
				next++
			}
		})
		for _, err := range []error{openErr, readErr} {
			var ce *CorruptionError
			if err != nil && !errors.As(err, &ce) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("%v: want a CorruptionError", err)
			}
		}
		if openErr != nil {
			if got > allocBound(data, nil) {
				t.Fatalf("a failed open of %d bytes allocated %d", len(data), got)
			}
			return
		}
		if readErr == nil && next < info.Next() {
			t.Fatalf("read ended at %d without an error, the part ends at %d", next, info.Next())
		}
		if bound := allocBound(data, r.index); got > bound {
			t.Fatalf("reading %d bytes allocated %d, more than they hold (%d)", len(data), got, bound)
		}
	})
}

// TestARecordLengthNotInItsShortestFormIsDamage: the writer puts each record's
// length in its shortest form, so one that takes a byte more (0x81 0x00 for 1)
// inside a block whose checksum holds was not written by it.
func TestARecordLengthNotInItsShortestFormIsDamage(t *testing.T) {
	if rec, rest, ok := cutRecord([]byte{0x81, 0x00, 'a'}); ok {
		t.Fatalf("a two-byte length of 1 cut to %q, %q", rec, rest)
	}
	if rec, rest, ok := cutRecord([]byte{0x01, 'a', 0x00}); !ok || string(rec) != "a" || len(rest) != 1 {
		t.Fatalf("a one-byte length of 1 cut to %q, %q, %v", rec, rest, ok)
	}
}
