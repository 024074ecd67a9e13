// Package ownership is an engine's ownership of shards through their manifests:
// publishing a manifest by compare-and-swap on the authority and copying it to
// every other replica (Store), and one instance's handle on one shard (Owner).
//
// Ownership is the authority's copy naming the owner: instance, epoch, and the
// acquisition of the instance's lease (internal/lease) it holds the shard under.
// The shard is owned while that lease lives, so an engine renews one lease
// however many shards it owns, and the renewals rewrite no manifest. Acquire
// takes a released shard, or one whose owner's lease ended, over by bumping the
// epoch (Inspect and Take are its two steps, for a takeover that reads the tail
// between them); Commit adds a part; Confirm writes the manifest unchanged;
// Release gives the shard up. Every write is a compare-and-swap on the version
// the Owner last saw, so once another instance bumped the epoch every publish
// fails with manifest.ErrFenced; and the Owner reports the lease lapsed
// (manifest.ErrLeaseExpired, which is also ErrFenced) from the skew margin before
// its expiry by its own clock, so an owner that cannot renew stops acknowledging
// before anyone may take over. After a lapse, a renewal that came too late starts
// a new generation of the lease, and each ownership is valid again only once
// Confirm published in it. The package's example shows Acquire and an Owner.
package ownership
