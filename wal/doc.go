// Package wal is the local log of unsealed pages for every shard of one engine, kept in
// one pebble DB so that pebble's group commit makes one fsync serve the concurrent
// appends of many shards.
//
// A page is one append: a batch of records of one shard with dense offsets. It is one
// pebble key:
//
//	page key:   'p' | shard id | 0x00 | first offset (uint64, big-endian)
//	page value:
//	+---------+-----------+--------------+---------------------+------------------+----------+
//	| version | count     | appended at  | payload bytes       | records          | CRC-32C  |
//	| 1 byte  | uint32 BE | int64 BE, ns | uint64 BE           | (uvarint length, | uint32 BE|
//	|         |           | (Unix)       | (sum of record lens)|  bytes) × count  |          |
//	+---------+-----------+--------------+---------------------+------------------+----------+
//
//	floor key:  'f' | shard id        value: uint64 BE, the offset the shard's pages
//	                                   start at after a truncation (the sealed watermark)
//
//	epoch key:  'o' | shard id        value: uint64 BE, the owner epoch appends and
//	                                   truncations must carry (set at each open)
//
//	l0-acked:   a file beside pebble's, the acknowledged watermark: per shard the floor
//	            and the end of the acknowledged records, rewritten atomically at most
//	            every Options.AckedInterval, at Close, and at an open that recovered
//	            more than it says (format in acked.go). Open refuses a log that
//	            replays to less.
//
// The CRC-32C (Castagnoli) covers the page key and every value byte before it, so a
// page that is damaged, or found under another shard's or offset's key, is reported as
// corruption. Shard ids never contain 0x00, so the separator keeps one shard's keys
// from running into another's, and big-endian offsets sort pages in offset order.
//
// Durability: Append returns after the pebble batch holding the page is synced; pebble
// writes batches to its own WAL in commit order and an fsync covers a prefix of it, so
// a page is never durable before an earlier page of the same shard. Pebble drops a
// torn tail of its WAL at open (those appends were never acknowledged) and reports
// corruption anywhere else, except inside its last log file, where damage reads as a
// torn tail too: the l0-acked watermark is what reports that. Reads see only durable
// pages, though pebble shows a batch before its sync: a read ends at the last page
// whose append's sync returned.
//
// Usage:
//
//	l, err := wal.Open(dir, wal.Options{})
//	err = l.SetEpoch("orders-7", epoch) // the shard's owner
//	first, err := l.Append(ctx, "orders-7", epoch, [][]byte{rec1, rec2}) // durable on return
//	for page, err := range l.Pages("orders-7", first) { ... }
//	err = l.TruncateThrough("orders-7", epoch, first+2) // pages before offset first+2 are sealed
package wal
