// Package tail is the format of a tail object: what one flush of an engine ships to
// the object store of every shard's pages that its WAL holds and has not shipped
// yet, so that the next owner of a shard, on any machine, can read the records its
// previous owner acknowledged and did not seal.
//
// One object per flush, whatever the number of shards:
//
//	+--------+-----------+-----------+-----+-------+---------+
//	| header | section 0 | section 1 | ... | index | trailer |
//	+--------+-----------+-----------+-----+-------+---------+
//
//	header   magic "l0tail\x00" (7) | version (1 byte) | sequence (uint64) |
//	         incarnation (uint64) | instance length (1 byte) | instance |
//	         writer length (1 byte) | writer | CRC-32C of the header bytes before it
//	         (uint32)
//
//	section  one shard's records, consecutive offsets from the entry's first, each a
//	         uvarint length and its bytes (never empty)
//
//	index    sequence (uint64) | incarnation (uint64) | entries (uint32) | per entry:
//	         +--------------+-------+-------+-------+----------+-------+---------+
//	         | shard length | shard | epoch | first | next     | pos   | len     |
//	         | 1 byte       |       | u64   | u64   | u64      | u64   | uint32  |
//	         +--------------+-------+-------+-------+----------+-------+---------+
//	         | CRC-32C of the section (uint32)
//	         followed by the CRC-32C of the index bytes before it (uint32)
//
//	trailer  24 bytes: index position (uint64) | index length (uint32) |
//	         CRC-32C of those 12 bytes (uint32) | version (1 byte) | magic (7)
//
// Integers are big-endian. Epoch is the owner epoch the shard's pages were
// appended under; first and next bound the section's offsets, [first, next).
//
// A reader of one shard, knowing the object's size (from a listing), reads the
// object's end — the trailer and, in the same request for any index under 64 KiB,
// the index — and then only its shard's section, checking its CRC: two requests an
// object, however many shards it holds. The index repeats the header's sequence and
// incarnation, so that a reader who never fetches the header still checks that the
// object is the one its key names.
//
// Keys are Key(instance, incarnation, sequence): under tail/, one stream per
// instance incarnation, sequences from 0, written with put-if-absent and never
// overwritten. A zero-byte object at a sequence is a fence: whoever wrote it has
// ended the stream there. The writer puts its objects in sequence order and stops
// at the first sequence it finds taken, so the lowest fence is the end of the
// stream and every sequence below it holds one of the writer's objects (Fence
// fills the sequences it skips with fences too). Decoders report a zero-byte object
// as ErrFence.
package tail
