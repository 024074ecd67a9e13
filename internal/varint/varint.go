// Package varint reads the uvarint length prefixes of l0's formats.
package varint

import "encoding/binary"

// Uvarint is binary.Uvarint for bytes l0 wrote: every length it writes is a
// uvarint in its shortest form (binary.AppendUvarint), so one that takes more
// bytes than its value needs was not written by l0 and is refused like an
// overflow, with k < 0. Accepting it would decode bytes that encode back to other
// bytes. A longer form is exactly one whose last byte, after at least one other,
// is zero: the bytes before it already hold the value.
func Uvarint(b []byte) (v uint64, k int) {
	v, k = binary.Uvarint(b)
	if k > 1 && b[k-1] == 0 {
		return 0, -k
	}
	return v, k
}
