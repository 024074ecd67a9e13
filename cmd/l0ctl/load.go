package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// What the commands read: the shards stored, their manifests on every replica and
// how each copy stands against the authority's, and the instance leases.

// storedShards returns the id of every shard with a manifest on b, in key order:
// the order of engine.StoredShards.
func storedShards(ctx context.Context, b *substrate.Bucket) ([]string, error) {
	var ids []string
	for e, err := range b.ListAll(ctx, "shards/") {
		if err != nil {
			return nil, fmt.Errorf("list the shards on %s: %w", b.Name(), err)
		}
		id, ok := strings.CutSuffix(strings.TrimPrefix(e.Key, "shards/"), "/manifest")
		if ok && !strings.Contains(id, "/") && manifest.Key(id) == e.Key {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// shardArgs are the shards a command names, or with none every stored shard.
func (c *call) shardArgs() ([]string, error) {
	if len(c.args) > 0 {
		return c.args, nil
	}
	return storedShards(c.ctx, c.store.Authority().Bucket)
}

// state is how a replica's copy of a manifest stands against the authority's.
type state string

const (
	stateAuthority  state = "authority"
	stateNone       state = "none"       // neither the authority nor the copy has one
	stateSame       state = "in step"    // the authority's bytes
	stateAbsent     state = "absent"     // no copy yet: behind
	stateBehind     state = "behind"     // an older manifest of the authority's history
	stateStale      state = "stale"      // another history that left nothing behind: the next publish's copy replaces it
	stateAhead      state = "ahead"      // newer than the authority's in its own history: the authority went back
	stateDiverged   state = "diverged"   // another history, which no copy replaces
	stateUnreadable state = "unreadable" // does not decode, or could not be read
	stateUncompared state = "uncompared" // the authority's cannot be read to compare it with
)

// damaged reports whether the state is damage rather than a copy in progress.
func (s state) damaged() bool {
	return s == stateAhead || s == stateDiverged || s == stateUnreadable
}

// manifestCopy is one replica's manifest of a shard.
type manifestCopy struct {
	Replica string
	M       manifest.Manifest
	Raw     []byte // nil: none there
	Err     error
	State   state
	Why     string
}

// Present reports whether the replica holds a manifest that decodes.
func (m manifestCopy) Present() bool { return m.Raw != nil && m.Err == nil }

// loadManifest reads the shard's manifest from b with its bytes, as the manifest
// package's own load does, and checks that it names the shard.
func loadManifest(ctx context.Context, b *substrate.Bucket, id string) manifestCopy {
	mc := manifestCopy{Replica: b.Name(), M: manifest.Manifest{Shard: id}}
	data, _, err := b.Get(ctx, manifest.Key(id))
	if errors.Is(err, substrate.ErrNotFound) {
		return mc
	}
	if err != nil {
		mc.Err = err
		return mc
	}
	mc.Raw = data
	m, err := manifest.Decode(data)
	if err == nil && m.Shard != id {
		err = fmt.Errorf("%w: it names shard %q", manifest.ErrCorrupt, m.Shard)
	}
	if err != nil {
		mc.Err = err
		return mc
	}
	mc.M = m
	return mc
}

// loadManifests reads the shard's manifest from every replica and says how each
// copy stands. The copies are read before the authority: a publish between the
// reads then shows a copy behind, which it is, rather than a copy ahead of the
// authority or diverged from it.
func loadManifests(ctx context.Context, s *store, id string) (auth manifestCopy, copies []manifestCopy) {
	for _, r := range s.Copies() {
		copies = append(copies, loadManifest(ctx, r.Bucket, id))
	}
	auth = loadManifest(ctx, s.Authority().Bucket, id)
	auth.State = stateAuthority
	if auth.Err != nil {
		auth.State, auth.Why = stateUnreadable, auth.Err.Error()
	}
	for i := range copies {
		copies[i].State, copies[i].Why = classify(auth, copies[i])
	}
	return auth, copies
}

// classify says how a copy stands against the authority's manifest a, by the
// rules the engines' copies follow (see manifest's copier): a copy in the
// authority's past is behind, and is brought forward by the next copy; a history
// that is not, was written by another authority (a cold open from that replica
// alone), and is left alone unless it was released with nothing of its own.
func classify(a, c manifestCopy) (state, string) {
	switch {
	case c.Err != nil:
		return stateUnreadable, c.Err.Error()
	case a.Err != nil:
		return stateUncompared, "the authority's manifest cannot be read to compare it with"
	case a.Raw == nil && c.Raw == nil:
		return stateNone, ""
	case c.Raw == nil:
		return stateAbsent, "no copy yet"
	case a.Raw == nil:
		return stateAhead, "the authority has no manifest of the shard"
	case bytes.Equal(a.Raw, c.Raw):
		return stateSame, ""
	}
	am, cm := a.M, c.M
	switch {
	case am.Authority == cm.Authority && am.Epoch == cm.Epoch && am.Seq == cm.Seq:
		return stateDiverged, fmt.Sprintf("another manifest at the authority's epoch %d seq %d", am.Epoch, am.Seq)
	case cm.Descends(am):
		return stateAhead, fmt.Sprintf("epoch %d seq %d of authority %q, past the authority's epoch %d seq %d of %q", cm.Epoch, cm.Seq, cm.Authority, am.Epoch, am.Seq, am.Authority)
	case am.Descends(cm) && !(cm.Epoch == am.Epoch && cm.Owner != am.Owner):
		return stateBehind, fmt.Sprintf("epoch %d seq %d, the authority's is epoch %d seq %d", cm.Epoch, cm.Seq, am.Epoch, am.Seq)
	case cm.Released && !cm.Backlog && cm.Epoch <= am.Epoch && partsPrefix(cm.Parts, am.Parts):
		return stateStale, fmt.Sprintf("epoch %d seq %d of authority %q, released with nothing of its own: the shard's next publish replaces it", cm.Epoch, cm.Seq, cm.Authority)
	}
	return stateDiverged, fmt.Sprintf("%q's epoch %d seq %d of authority %q, not in the history of the authority's (%q's epoch %d seq %d of %q)",
		cm.Owner, cm.Epoch, cm.Seq, cm.Authority, am.Owner, am.Epoch, am.Seq, am.Authority)
}

// partsPrefix reports whether a's parts are the first of b's.
func partsPrefix(a, b []manifest.Part) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key {
			return false
		}
	}
	return true
}

// leases are the instance leases on the authority, by instance id, and the keys
// of those that do not decode.
type leases struct {
	recs    map[string]lease.Record
	corrupt []string
	read    time.Time // when the listing began, by this machine's clock
}

func readLeases(ctx context.Context, b *substrate.Bucket) (leases, error) {
	at := time.Now()
	recs, corrupt, err := lease.ListAll(ctx, b, lease.InstancesPrefix, "/lease")
	if err != nil {
		return leases{}, err
	}
	l := leases{recs: map[string]lease.Record{}, corrupt: corrupt, read: at}
	for key, r := range recs {
		if id, ok := instanceOf(key); ok {
			l.recs[id] = r
		}
	}
	return l, nil
}

// instanceOf is the instance whose lease is under key.
func instanceOf(key string) (string, bool) {
	id, ok := strings.CutSuffix(strings.TrimPrefix(key, lease.InstancesPrefix), "/lease")
	return id, ok && id != "" && !strings.Contains(id, "/") && lease.InstanceKey(id) == key
}

// leaseState says whether a lease record lives, for a reader whose read began at
// at: live, lapsed (and since when), or released.
func leaseState(r lease.Record, at time.Time, skew time.Duration) string {
	switch {
	case r.Holder == "":
		return "none"
	case r.Released:
		return "released"
	case r.Live(at, skew):
		return "live"
	}
	return fmt.Sprintf("lapsed %s ago", at.Sub(r.Expiry).Round(time.Second))
}

// ownership says who owns a shard by its manifest and the owner's lease: the
// manifest package's rule (the owner's instance lease, of the acquisition the
// manifest names or one that carries it, lives), judged by this machine's clock.
func ownership(m manifest.Manifest, l leases, skew time.Duration) string {
	switch {
	case m.Owner == "" && m.Epoch == 0:
		return "new"
	case m.Released && m.Backlog:
		return "released with a backlog"
	case m.Released:
		return "released"
	case m.Lease == "": // a manifest written before instance leases
		if l.read.Before(m.LeaseExpiry.Add(skew)) {
			return "owned"
		}
		return "lapsed"
	}
	r, ok := l.recs[m.Owner]
	switch {
	case !ok:
		return "owned? (its lease object is gone)"
	case r.Holder == m.Owner && r.Released:
		return "free (its lease was released)"
	case r.Holder != m.Owner || !r.Holds(m.Lease):
		return "free (its lease is of another acquisition)"
	case r.Live(l.read, skew):
		return "owned"
	}
	return "lapsed"
}
