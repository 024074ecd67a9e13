// Package part is the format of a sealed part: a contiguous offset range of one
// shard's records, compressed in blocks and checksummed, written once to the object
// store and never changed.
//
//	+--------+---------+---------+-----+-------+--------+
//	| header | block 0 | block 1 | ... | index | footer |
//	+--------+---------+---------+-----+-------+--------+
//
//	header  8 bytes: magic "l0prt" | version (1 byte) | 2 bytes zero
//
//	block   one zstd frame of records, each a uvarint length and its bytes; blocks
//	        are cut at the first record that takes the raw block to BlockSize
//	        (64 KiB by default), so a record is never split.
//
//	index   shard id length (1 byte) | shard id | first offset (uint64) |
//	        block count (uint32) | per block, 32 bytes:
//	        +--------------+-----------+-------------+-----------+-----------+----------+
//	        | first offset | records   | file offset | stored len| raw len   | CRC-32C  |
//	        | uint64       | uint32    | uint64      | uint32    | uint32    | uint32   |
//	        +--------------+-----------+-------------+-----------+-----------+----------+
//	        | CRC-32C of the index (uint32)
//	        (the block CRC covers the block's stored, compressed bytes)
//
//	footer  44 bytes:
//	        +--------------+-----------+-----------+-----------+----------+------------+---------+---------+
//	        | index offset | index len | records   | raw bytes | part CRC | footer CRC | version | magic   |
//	        | uint64       | uint32    | uint64    | uint64    | uint32   | uint32     | 1 byte  | "l0part\x00" (7) |
//	        +--------------+-----------+-----------+-----------+----------+------------+---------+---------+
//	        part CRC: CRC-32C of every byte of the part before it
//	        footer CRC: CRC-32C of the footer bytes before it
//
// Integers are big-endian. A reader of the whole part (Verify, or Records from the
// first offset to the end) checks every checksum; a reader from an offset in the
// middle reads the header, the footer and the index and then only the blocks from
// the one holding that offset, checking theirs. Every failed check is a
// *CorruptionError naming the part and the byte position. The writer refuses empty
// records; the reader still reads a block of them, in no more memory than the block.
//
// Usage:
//
//	w := part.NewWriter(f, "orders-7", 1200, part.Options{})
//	for _, rec := range recs { err = w.Add(rec) }
//	info, err := w.Close()              // info.Count, info.Size, info.CRC
//	r, err := part.Open(readerAt, size, "orders-7/parts/...")
//	for rec, err := range r.Records(1250) { ... }
package part
