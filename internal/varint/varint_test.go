package varint

import (
	"encoding/binary"
	"testing"
)

// TestUvarintTakesOnlyTheShortestForm: over every string of up to two bytes, every
// three-byte string of boundary bytes, and every value at a seven-bit boundary
// padded with zero bytes, Uvarint accepts exactly what binary.Uvarint does in the
// form binary.AppendUvarint writes.
func TestUvarintTakesOnlyTheShortestForm(t *testing.T) {
	check := func(b []byte) {
		t.Helper()
		want, wk := binary.Uvarint(b)
		shortest := wk > 0 && wk == len(binary.AppendUvarint(nil, want))
		got, k := Uvarint(b)
		switch {
		case shortest && (k != wk || got != want):
			t.Fatalf("% x: %d, %d; want %d, %d", b, got, k, want, wk)
		case !shortest && k > 0:
			t.Fatalf("% x: %d in %d bytes, not its shortest form, accepted", b, got, k)
		}
	}
	for n := range 1 << 16 {
		check([]byte{byte(n)})
		check([]byte{byte(n), byte(n >> 8)})
	}
	edges := []byte{0x00, 0x01, 0x7f, 0x80, 0x81, 0xff}
	for _, a := range edges {
		for _, b := range edges {
			for _, c := range edges {
				check([]byte{a, b, c})
			}
		}
	}
	for i := range 64 {
		for _, v := range []uint64{1<<i - 1, 1 << i, 1<<i + 1} {
			b := binary.AppendUvarint(nil, v)
			for range 3 { // v, then v padded with one and two zero bytes
				check(b)
				b[len(b)-1] |= 0x80
				b = append(b, 0)
			}
		}
	}
}
