// Package manifest is the per-shard manifest: the shard's sealed parts and where
// each is stored, the sealed watermark, and the owner's lease; its durable encoding;
// and publishing it with compare-and-swap.
//
// The manifest of shard s is the object "shards/s/manifest" on the authority
// substrate, copied to every other substrate given. Its encoding:
//
//	+---------+---------+----------------------------------+----------+
//	| magic   | version | body: JSON of Manifest           | CRC-32C  |
//	| "l0man" | 1 byte  | (UTF-8, any length)              | uint32 BE|
//	+---------+---------+----------------------------------+----------+
//
// The CRC covers magic, version and body. A newer version is ErrUnknownVersion, any
// other damage ErrCorrupt. The durable manifest never names a local file: after a
// restart every part is read from a substrate.
//
// Ownership is the authority's copy naming the owner: instance, epoch, and the
// acquisition of the instance's lease (internal/lease) it holds the shard under.
// The shard is owned while that lease lives, so an engine renews one lease
// however many shards it owns, and the renewals rewrite no manifest. An Owner is
// this instance's handle on one shard: Acquire takes a released shard, or one
// whose owner's lease ended, over by bumping the epoch; Commit adds a part; Confirm
// writes the manifest unchanged; Release gives the shard up. Every write is a
// compare-and-swap on the version the Owner last saw, so once another instance
// bumped the epoch every publish fails with ErrFenced; and the Owner reports the
// lease lapsed (ErrLeaseExpired, which is also ErrFenced) from the skew margin
// before its expiry by its own clock, so an owner that cannot renew stops
// acknowledging before anyone may take over. After a lapse, a renewal that came
// too late starts a new generation of the lease, and each ownership is valid
// again only once Confirm published in it. Acquire and Owner are shown in the
// package's examples.
package manifest
