// Package wal is the local log of unsealed pages for every shard of one engine: a
// sequence of segment files, written by one flusher so that one fdatasync serves the
// concurrent appends of many shards, with an in-memory index of each shard's pages.
//
// A page is one append: a batch of records of one shard with dense offsets, written
// as its key and value:
//
//	page key:   'p' | shard id | 0x00 | first offset (uint64, big-endian)
//	page value:
//	+---------+-----------+--------------+---------------------+------------------+----------+
//	| version | count     | appended at  | payload bytes       | records          | CRC-32C  |
//	| 1 byte  | uint32 BE | int64 BE, ns | uint64 BE           | (uvarint length, | uint32 BE|
//	|         |           | (Unix)       | (sum of record lens)|  bytes) × count  |          |
//	+---------+-----------+--------------+---------------------+------------------+----------+
//
// The CRC-32C (Castagnoli) covers the page key and every value byte before it, so a
// page that is damaged, or found under another shard's or offset's key, is reported as
// corruption. Shard ids never contain 0x00.
//
// Pages and a shard's floor (after a truncation), reset and owner epoch are entries of
// groups, each group what one write and one fdatasync put in a segment; the first
// group of each segment starts with a checkpoint of every shard's epoch and floor
// (formats in entry.go). Beside the segments:
//
//	LOCK:       the directory's lock, held while the log is open.
//	l0-acked:   the acknowledged watermark: per shard the floor, the end of the
//	            acknowledged records, the owner epoch and the group of the last
//	            reset, rewritten atomically at most every Options.AckedInterval,
//	            before SetEpoch returns, at Close, and at an open that recovered
//	            other than it says (format in acked.go). Open refuses a log that
//	            replays to less.
//
// Durability: Append returns after the group holding its page is synced; groups reach
// the disk in order and a shard's pages enter them in offset order, so a page is
// never durable before an earlier page of the same shard. Open drops the torn group a
// crash left at the end of the newest segment (it was never acknowledged) and reports
// damage anywhere a synced group follows; damage to the newest segment's last groups
// reads as a torn tail too, and the l0-acked watermark is what reports that. Reads see
// only durable pages: a read ends at the last page whose append's sync returned. A
// segment is recycled or removed once every page in it is sealed and no read holds it.
package wal
