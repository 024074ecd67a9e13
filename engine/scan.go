package engine

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"strings"
	"time"

	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// StoredShards iterates over the id of every shard with a manifest on the
// authority, in the order of the keys (bytewise), open here or not: the order in
// which a store-wide scan visits them. It stops after yielding an error.
func (e *Engine) StoredShards(ctx context.Context) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for ent, err := range e.store.Authority().ListAll(ctx, "shards/") {
			if err != nil {
				yield("", fmt.Errorf("engine: list the shards: %w", err))
				return
			}
			id, ok := strings.CutSuffix(strings.TrimPrefix(ent.Key, "shards/"), "/manifest")
			if !ok || strings.Contains(id, "/") || shard.ValidateID(id) != nil {
				continue // a part, or not a manifest of ours
			}
			if !yield(id, nil) {
				return
			}
		}
	}
}

// Assess reads the manifest of each shard id from the authority — the open shards'
// as their owners last published them — and says what their parts' copies say
// about the data: the durability of shards nobody has open as much as of those
// open here.
func (e *Engine) Assess(ctx context.Context, ids []string) (replica.Durability, error) {
	owners, _ := e.owners()
	var parts []replication.PartReplicas
	for _, id := range ids {
		var ps []manifest.Part
		if o, ok := owners[id]; ok {
			ps = o.Manifest().Parts
		} else {
			m, _, err := e.store.Load(ctx, id)
			if err != nil {
				return replica.Durability{}, err
			}
			ps = m.Parts
		}
		parts = appendPartReplicas(parts, ps)
	}
	return e.set.Assess(parts, e.uploader.Pending), nil
}

// BackfillIdle brings the parts of shard id onto every replica of the set when
// nobody owns it: it was released with nothing left unsealed. It takes the shard
// over for the copies, which record their locations in its manifest, and closes
// it again. It returns the parts copied; 0 with a nil error when the shard is
// open here (BackfillUnderReplicated covers it), owned by another instance, or
// lacks no copy. A takeover of unknown outcome, or a close that fails, leaves the
// shard to be given back after a later renewal.
func (e *Engine) BackfillIdle(ctx context.Context, id string) (int, error) {
	if e.set.Len() < 2 {
		return 0, nil
	}
	if owners, _ := e.owners(); owners[id] != nil {
		return 0, nil
	}
	m, _, err := e.store.Load(ctx, id)
	if err != nil {
		return 0, err
	}
	if !m.Released || m.Backlog || !e.lacksCopies(m.Parts) {
		return 0, nil
	}
	sh, err := e.OpenShard(ctx, id)
	if errors.Is(err, ErrOwned) || errors.Is(err, ErrShardOpen) {
		return 0, nil // taken meanwhile: its owner's business
	}
	if err != nil {
		return 0, err
	}
	owners, _ := e.owners()
	n, berr := e.backfill(id, owners[id])
	var werr error
	if berr == nil {
		select {
		case <-e.uploader.Idle(id):
		case <-ctx.Done():
			werr = ctx.Err()
		}
	}
	// The shard is given back on a context of its own: a caller's that ended
	// would leave it owned, and open nowhere.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.Lease.Duration)
	defer cancel()
	cerr := sh.Close(cctx)
	if cerr != nil {
		e.GiveBack(id)
	}
	return n, errors.Join(berr, werr, cerr)
}

// lacksCopies reports whether some part lacks a replica of the set.
func (e *Engine) lacksCopies(parts []manifest.Part) bool {
	for _, p := range parts {
		if len(e.set.Missing(p.Replicas)) > 0 {
			return true
		}
	}
	return false
}

// CollectOrphanParts deletes the part objects of shard id, on every replica of the
// set, that no manifest names and none ever will: sealed under an epoch before the
// authority's manifest's (their sealer was fenced, or its commit failed), named
// neither by that manifest nor by the replica's own copy (which may hold another
// history, an operator's to decide), and last written more than olderThan ago by
// the store's clock. It returns how many it deleted.
func (e *Engine) CollectOrphanParts(ctx context.Context, id string, olderThan time.Duration) (int, error) {
	m, _, err := e.store.Load(ctx, id)
	if err != nil || m.Epoch == 0 {
		return 0, err
	}
	named := map[string]bool{}
	for _, p := range m.Parts {
		named[p.Key] = true
	}
	cutoff := e.opts.Clock.Now().Add(-olderThan)
	var n int
	var errs []error
	for _, sp := range e.set.Specs() {
		copyOf, err := manifest.LoadFrom(ctx, sp.Bucket, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		keep := maps.Clone(named)
		for _, p := range copyOf.Parts {
			keep[p.Key] = true
		}
		for ent, err := range sp.Bucket.ListAll(ctx, manifest.PartsPrefix(id)) {
			if err != nil {
				errs = append(errs, err)
				break
			}
			epoch, ok := manifest.PartKeyEpoch(id, ent.Key)
			if !ok || keep[ent.Key] || epoch >= m.Epoch {
				continue
			}
			attrs, err := sp.Bucket.Attributes(ctx, ent.Key)
			if err != nil || attrs.Modified.IsZero() || !attrs.Modified.Before(cutoff) {
				continue // gone already, or too young to judge, or no time to judge by
			}
			if err := sp.Bucket.Delete(ctx, ent.Key); err != nil && !errors.Is(err, substrate.ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			n++
		}
	}
	if n > 0 {
		e.opts.Logger.Info("engine: deleted orphan parts", "shard", id, "parts", n)
	}
	return n, errors.Join(errs...)
}
