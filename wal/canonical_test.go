package wal

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestLengthsNotInTheirShortestFormAreDamage: the log writes every length prefix in
// its shortest form, so a page or a watermark file whose length takes a byte more
// (0x81 0x00 for 1) was not written by it and is damage, even under a valid
// checksum. Accepting it would decode bytes that encode back to other bytes.
func TestLengthsNotInTheirShortestFormAreDamage(t *testing.T) {
	long := []byte{0x81, 0x00} // 1, in two bytes

	marks := encodeMarks(map[string]mark{"a": {acked: 7}})
	at := len(ackedMagic) + 1 + 4 // the first id's length
	if marks[at] != 1 {
		t.Fatalf("the watermark's first id length is %#x, want 1", marks[at])
	}
	marks = slices.Concat(marks[:at], long, marks[at+1:])
	resealMarks(marks)
	if got, err := decodeMarks(marks); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a watermark with a two-byte id length of 1 decoded to %v, %v; want ErrCorrupt", got, err)
	}

	page := encodePage(nil, "s", 0, time.Unix(0, 1), [][]byte{[]byte("a")})
	if page[pageHeaderLen] != 1 {
		t.Fatalf("the page's first record length is %#x, want 1", page[pageHeaderLen])
	}
	page = slices.Concat(page[:pageHeaderLen], long, page[pageHeaderLen+1:])
	resealPage("s", 0, page)
	var ce *CorruptionError
	if got, err := decodePage("s", 0, page); !errors.As(err, &ce) || ce.Shard != "s" || ce.Offset != 0 {
		t.Fatalf("a page with a two-byte record length of 1 decoded to %v, %v; want a CorruptionError at s/0", got.Records, err)
	}

	if id, rest, ok := cutID(slices.Concat(long, []byte("a"))); ok {
		t.Fatalf("an entry's id with a two-byte length of 1 cut to %q, %q", id, rest)
	}
}
