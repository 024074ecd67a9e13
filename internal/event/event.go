// Package event is how an engine hears what its shards, its uploader and its tail
// did: one Listener of callbacks, which the engine fills once when it opens and
// hands to each of them, in the manner of pebble's EventListener. Everything the
// engine's metrics and log are told of these comes through it, so the one place to
// read what is observed, and what a component reports, is the engine's Listener.
package event

import (
	"time"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
)

// Listener is the callbacks of one engine. Each runs on the goroutine of what it
// reports and must not block it.
type Listener struct {
	// AppendEnded is told of every call to a shard's Append: its records and
	// bytes, how long it took, and its error (nil once the records are durable).
	// It runs on the append path: it must be cheap and safe for concurrent use.
	AppendEnded func(records, bytes int, took time.Duration, err error)
	// ShardClosed is told once per shard, when it has closed or retired, of the
	// parts whose commit had an unknown outcome that it could not settle: each may
	// be in the manifest without its copies, until a backfill.
	ShardClosed func(shard string, inDoubt []manifest.Part)
	// PartReplicated is told, of every part sealed in this process, how long
	// after its seal every replica held it.
	PartReplicated func(lag time.Duration)
	// TailShipped is told of every tail object shipped.
	TailShipped func(tail.ShipInfo)
}
