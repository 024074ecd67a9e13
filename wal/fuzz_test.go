package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// allocated returns the bytes f allocated.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// resealPage recomputes the checksum of page value v, stored under shard's key
// for offset first, over what precedes it.
func resealPage(shard string, first uint64, v []byte) {
	if len(v) < crcLen {
		return
	}
	body := v[:len(v)-crcLen]
	binary.BigEndian.PutUint32(v[len(body):], crc32.Update(crc32.Checksum(pageKey(shard, first), castagnoli), castagnoli, body))
}

// pageAllocBound is what decoding a page value of n bytes may allocate: a slice
// header per record, each of which takes a byte at least, and the page key and
// error around it; the MiB is slack for what the fuzzing process allocates meanwhile.
func pageAllocBound(shard string, n int) uint64 {
	return 32*uint64(n) + 2*uint64(len(shard)) + 1<<20
}

// checkPage holds decodeHeader and decodePage of v to what a page decoder owes: a
// *CorruptionError that names the page, or a page whose records are the bytes of v
// and encode back to them, with no more allocated than v's bytes hold.
func checkPage(t *testing.T, shard string, first uint64, v []byte) {
	t.Helper()
	h, herr := decodeHeader(shard, first, v)
	var p Page
	var err error
	got := allocated(func() { p, err = decodePage(shard, first, v) })
	if bound := pageAllocBound(shard, len(v)); got > bound {
		t.Fatalf("decoding a page of %d bytes allocated %d, more than they hold (%d): %v", len(v), got, bound, err)
	}
	for _, err := range []error{herr, err} {
		var ce *CorruptionError
		switch {
		case err == nil:
		case !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt):
			t.Fatalf("%v: want a CorruptionError", err)
		case ce.Shard != shard || ce.Offset != first:
			t.Fatalf("%v: names shard %q offset %d, want %q %d", err, ce.Shard, ce.Offset, shard, first)
		}
	}
	if herr == nil && (h.count < 1 || h.count > MaxPageRecords) {
		t.Fatalf("a header of %d records", h.count)
	}
	if err != nil {
		return
	}
	if herr != nil {
		t.Fatalf("the page decodes, its header does not: %v", herr)
	}
	var payload uint64
	for _, r := range p.Records {
		payload += uint64(len(r))
	}
	switch {
	case p.Shard != shard || p.FirstOffset != first:
		t.Fatalf("page of shard %q at %d, decoded from %q at %d", p.Shard, p.FirstOffset, shard, first)
	case len(p.Records) != h.count || payload != h.payload || !p.AppendedAt.Equal(h.appendedAt):
		t.Fatalf("page of %d records, %d bytes, appended %v; its header says %d, %d, %v",
			len(p.Records), payload, p.AppendedAt, h.count, h.payload, h.appendedAt)
	case payload+uint64(len(p.Records)) > uint64(len(v)-pageHeaderLen-crcLen):
		t.Fatalf("%d records of %d bytes from a page of %d", len(p.Records), payload, len(v))
	case p.NextOffset() != first+uint64(h.count):
		t.Fatalf("page at %d of %d records ends at %d", first, h.count, p.NextOffset())
	}
	if again := encodePage(nil, shard, first, p.AppendedAt, p.Records); !bytes.Equal(again, v) {
		t.Fatalf("decoded %d bytes, encode back to %d other bytes", len(v), len(again))
	}
}

// FuzzDecodePage: no page value makes decodeHeader or decodePage panic, fail with
// other than a CorruptionError naming the page, or allocate beyond what its bytes
// hold; what decodes agrees with its header, holds records that fit in the value
// and encodes back to the same bytes. Each input is decoded also with its checksum
// recomputed, so the fuzzer reaches the counts and lengths behind it.
func FuzzDecodePage(f *testing.F) {
	at := time.Date(2025, 3, 1, 12, 30, 0, 123456789, time.UTC)
	f.Add("s", uint64(0), encodePage(nil, "s", 0, at, [][]byte{[]byte("a")}))
	f.Add("orders-7", uint64(1<<40), encodePage(nil, "orders-7", 1<<40, at, recs("r", 5)))
	f.Add("", uint64(1<<64-1), encodePage(nil, "", 1<<64-1, time.Unix(0, -1), [][]byte{{}, []byte("b"), {}}))
	f.Add("s\x00", uint64(7), encodePage(nil, "s\x00", 7, time.Unix(0, 1<<63-1), [][]byte{bytes.Repeat([]byte{0xff}, 300), []byte(strings.Repeat("x", 127))}))
	f.Add("s", uint64(3), []byte{})
	f.Fuzz(func(t *testing.T, shard string, first uint64, v []byte) {
		checkPage(t, shard, first, v)
		v = bytes.Clone(v)
		resealPage(shard, first, v)
		checkPage(t, shard, first, v)
	})
}

// resealMarks recomputes the checksum of watermark file b over what precedes it.
func resealMarks(b []byte) {
	if len(b) < crcLen {
		return
	}
	body := b[:len(b)-crcLen]
	binary.BigEndian.PutUint32(b[len(body):], crc32.Checksum(body, castagnoli))
}

// encodeMarksV1 encodes marks in the first format of the watermark file, version 1,
// which has no epochs and resets, for the tests that hold the decoder to it.
func encodeMarksV1(marks map[string]mark) []byte {
	b := append([]byte(ackedMagic), ackedVersion1)
	b = binary.BigEndian.AppendUint32(b, uint32(len(marks)))
	for _, id := range slices.Sorted(maps.Keys(marks)) {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
		b = binary.BigEndian.AppendUint64(b, marks[id].floor)
		b = binary.BigEndian.AppendUint64(b, marks[id].acked)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// marksAllocBound is what decoding a watermark file of n bytes may allocate: a map
// entry and an id per shard, each of which takes 17 bytes at least, and the error;
// the MiB is slack for what the fuzzing process allocates meanwhile.
func marksAllocBound(n int) uint64 { return 16*uint64(n) + 1<<20 }

// checkMarksDecode holds decodeMarks of b to what it owes: ErrCorrupt, or marks that
// encode to a file that decodes to them, with no more allocated than b's bytes hold.
func checkMarksDecode(t *testing.T, b []byte) {
	t.Helper()
	var marks map[string]mark
	var err error
	got := allocated(func() { marks, err = decodeMarks(b) })
	if bound := marksAllocBound(len(b)); got > bound {
		t.Fatalf("decoding a watermark of %d bytes allocated %d, more than they hold (%d): %v", len(b), got, bound, err)
	}
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v: want ErrCorrupt", err)
		}
		if marks != nil {
			t.Fatalf("%v, and %d marks", err, len(marks))
		}
		return
	}
	// A file of unsorted or repeated ids decodes too (the last of an id wins): its
	// encoding, in its version, holds the same entries, sorted, less the repeats.
	again := encodeMarks(marks)
	if b[len(ackedMagic)] == ackedVersion1 {
		again = encodeMarksV1(marks)
	}
	count := binary.BigEndian.Uint32(b[len(ackedMagic)+1:])
	switch {
	case uint64(len(marks)) > uint64(count):
		t.Fatalf("%d marks from a file of %d", len(marks), count)
	case uint64(len(marks)) == uint64(count) && len(again) != len(b), len(again) > len(b):
		t.Fatalf("%d marks from a file of %d in %d bytes encode to %d", len(marks), count, len(b), len(again))
	}
	back, err := decodeMarks(again)
	if err != nil || !maps.Equal(back, marks) {
		t.Fatalf("round trip: %v, %v; want %v", back, err, marks)
	}
}

// FuzzDecodeMarks: no watermark file makes decodeMarks panic, fail with other than
// ErrCorrupt, or allocate beyond what its bytes hold; what decodes round-trips
// through encodeMarks. Each input is decoded also with its checksum recomputed, so
// the fuzzer reaches the shard count and entries behind it.
func FuzzDecodeMarks(f *testing.F) {
	f.Add(encodeMarks(nil))
	f.Add(encodeMarks(map[string]mark{"a": {floor: 0, acked: 7}}))
	f.Add(encodeMarks(map[string]mark{"a": {floor: 0, acked: 7}, "orders-7": {floor: 100, acked: 1 << 40}, "": {floor: 1<<64 - 1, acked: 1<<64 - 1}}))
	f.Add(encodeMarks(map[string]mark{strings.Repeat("s", 200): {floor: 3, acked: 3}, "\x00": {acked: 1}}))
	f.Add(encodeMarks(map[string]mark{"a": {floor: 2, acked: 7, epoch: 3, reset: 9}, "b": {epoch: 1<<64 - 1}}))
	f.Add(encodeMarksV1(map[string]mark{"a": {floor: 0, acked: 7}, "orders-7": {floor: 100, acked: 1 << 40}}))
	f.Add([]byte(ackedMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkMarksDecode(t, b)
		b = bytes.Clone(b)
		resealMarks(b)
		checkMarksDecode(t, b)
	})
}
