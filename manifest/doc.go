// Package manifest is the per-shard manifest: the shard's sealed parts and where
// each is stored, the sealed watermark, and the owner's lease; its durable encoding;
// and reading it from a store (the engine publishes it, with compare-and-swap).
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
// acquisition of the instance's lease it holds the shard under (Owner, Lease),
// and whether it released the shard. The engine takes, holds and releases
// shards; this package is the format a reader of a store (an operator's tool, a
// consumer) needs: Decode, Read and LoadFrom, the object keys, and Descends and
// After, which order the manifests of one shard's history.
package manifest
