package shard

import (
	"context"
	"time"

	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/internal/sealer"
	"github.com/l0store/l0/seal"
)

var _ sealer.Target = (*Shard)(nil)

// Unsealed implements sealer.Target.
func (s *Shard) Unsealed() (uint64, time.Time) {
	info := s.cfg.Log.Info(s.id)
	return info.UnsealedBytes, info.Oldest
}

// Seal implements sealer.Target: it seals the oldest unsealed pages, up to budget
// record bytes but at least one page, and first settles the parts whose commit had
// an unknown outcome; it queues the copies of every part that commits, and returns
// without waiting for them. Every seal is counted in the engine's seal metrics,
// whoever runs it.
func (s *Shard) Seal(ctx context.Context, budget uint64) (seal.Result, error) {
	out, err := s.job().Run(ctx, budget)
	s.copy(out.Committed) // a truncation that failed after the commit leaves them committed
	return out.Result, err
}

// job is a seal of the shard.
func (s *Shard) job() sealer.Job {
	first := s.cfg.Replicas.First()
	return sealer.Job{
		Shard: s.id, Epoch: s.epoch, Log: s.cfg.Log, Owner: s.cfg.Owner, Bucket: first.Bucket, Replica: first.Name,
		// A part no other replica needs a copy of needs no local file to copy it from.
		Direct: s.cfg.Replicas.Len() == 1 && first.Bucket.Streams(),
		Dir:    s.cfg.PartsDir, FS: s.cfg.FS, BlockSize: s.cfg.BlockSize, Encoder: s.cfg.Encoder, Clock: s.cfg.Clock,
		Counters: s.cfg.Sealer.Counters(), Doubts: &s.doubts, Tail: s.cfg.Tail,
	}
}

// copy queues the copies of parts a seal committed, from their local files, to
// every replica that lacks them, with the shard's owner as their recorder: it
// owns the manifest the locations go in. Each file goes when its copies end, or at
// once if no replica lacks the part or the uploader has closed (the part then
// stays short until a backfill).
func (s *Shard) copy(committed []sealer.Committed) {
	for _, c := range committed {
		p, file := c.Part, c.File
		remove := func() { sealer.RemoveFile(s.cfg.FS, file) }
		targets := s.cfg.Replicas.Missing(p.Replicas)
		if len(targets) == 0 {
			remove()
			continue
		}
		source := replication.FromFile(file)
		if file == "" { // written straight into the first replica
			source = replication.FromReplica(s.cfg.Replicas.First().Name, p.Key)
		}
		err := s.cfg.Uploader.Enqueue(replication.Job{
			Shard: s.id, Key: p.Key, Size: p.Size, CRC: p.CRC, Source: source,
			Targets: targets, SealedAt: p.SealedAt, Recorder: s.cfg.Owner,
			Done: func(error) { remove() },
		})
		if err != nil {
			remove()
		}
	}
}
