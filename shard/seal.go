package shard

import (
	"context"
	"time"

	"github.com/l0store/l0/seal"
)

var _ seal.Target = (*Shard)(nil)

// Unsealed implements seal.Target.
func (s *Shard) Unsealed() (uint64, time.Time) {
	info := s.cfg.Log.Info(s.id)
	return info.UnsealedBytes, info.Oldest
}

// Seal implements seal.Target: it seals the oldest unsealed pages, up to budget
// record bytes but at least one page, and first settles the parts whose commit had
// an unknown outcome. Every seal is counted in the engine's seal metrics, whoever
// runs it.
func (s *Shard) Seal(ctx context.Context, budget uint64) (seal.Result, error) {
	return s.job().Run(ctx, budget)
}

// job is a seal of the shard.
func (s *Shard) job() seal.Job {
	first := s.cfg.Replicas.First()
	return seal.Job{
		Shard: s.id, Epoch: s.epoch, Log: s.cfg.Log, Owner: s.cfg.Owner, Bucket: first.Bucket, Replica: first.Name,
		Dir: s.cfg.PartsDir, FS: s.cfg.FS, BlockSize: s.cfg.BlockSize, Encoder: s.cfg.Encoder, Clock: s.cfg.Clock,
		AfterCommit: s.cfg.AfterCommit, Counters: s.cfg.Sealer.Counters(), Doubts: &s.doubts,
	}
}
