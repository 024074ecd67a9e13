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
// Ownership is a lease in the authority's copy: owner, epoch, expiry. An
// Owner is this instance's handle on one shard's lease: Acquire takes a released or
// expired lease over by bumping the epoch, Renew extends it, Commit adds a part (and
// renews), Release gives it up. Every write is a compare-and-swap on the version the
// Owner last saw, so once another instance bumped the epoch every publish fails with
// ErrFenced; and the Owner reports the lease lapsed (ErrLeaseExpired, which is also
// ErrFenced) from SkewMargin before its expiry by its own clock, so an owner that
// cannot renew stops acknowledging before anyone may take over.
//
// Usage:
//
//	st := manifest.NewStore(authority, copies...)
//	o, err := manifest.Acquire(ctx, st, "orders-7", instanceID, manifest.LeaseOptions{})
//	if err := o.Valid(); err != nil { ... }   // before acknowledging an append
//	err = o.Commit(ctx, part)                  // ErrFenced once the epoch moved
//	err = o.Release(ctx)
package manifest
