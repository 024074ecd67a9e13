package engine

import (
	"time"

	"github.com/l0store/l0/internal/event"
	"github.com/l0store/l0/manifest"
)

// newEvents fills the engine's one Listener, given to every shard, the uploader and
// the tail: whatever they report reaches the metrics and the log from here, and
// nowhere else.
func (e *Engine) newEvents() event.Listener {
	userLag := e.opts.Upload.ObserveLag
	return event.Listener{
		AppendEnded: e.metrics.observeAppend,
		ShardClosed: e.shardClosed,
		PartReplicated: func(lag time.Duration) {
			e.metrics.lag.Observe(lag.Seconds())
			if userLag != nil {
				userLag(lag)
			}
		},
		TailShipped: e.metrics.observeShipped,
	}
}

// shardClosed forgets a shard that closed or retired, so that it can be opened
// again, and logs the parts in doubt it leaves: nothing else will say they may
// lack their copies.
func (e *Engine) shardClosed(id string, inDoubt []manifest.Part) {
	// The tail forgets the shard's pages before the engine does: once forget
	// returns, an OpenShard of the same shard may give the tail its backlog,
	// which a later Drop would throw away.
	e.tail.Drop(id)
	e.forget(id)
	for _, p := range inDoubt {
		e.opts.Logger.Warn("engine: a part whose commit had an unknown outcome was not settled before the shard closed: if it was committed, it lacks its copies until BackfillUnderReplicated",
			"shard", id, "part", p.Key)
	}
}
