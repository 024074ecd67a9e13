package manifest

import (
	"context"
	"errors"
	"fmt"

	"github.com/l0store/l0/substrate"
)

// Key is the object key of shard's manifest.
func Key(shard string) string { return "shards/" + shard + "/manifest" }

// PartsPrefix is the prefix of the object keys of shard's parts.
func PartsPrefix(shard string) string { return "shards/" + shard + "/parts/" }

// PartKey is the object key of a part of shard covering [first, next), sealed by
// epoch; nonce makes every seal attempt's key unique, so a retried or fenced seal
// never collides with another.
func PartKey(shard string, first, next, epoch uint64, nonce string) string {
	return fmt.Sprintf("%s%020d-%020d-e%d-%s", PartsPrefix(shard), first, next, epoch, nonce)
}

// Store publishes manifests: compare-and-swap on the authority, then a plain copy
// to every other substrate.
type Store struct {
	authority *substrate.Bucket
	copies    []*substrate.Bucket
}

// NewStore returns a Store over the authority substrate and the copies.
func NewStore(authority *substrate.Bucket, copies ...*substrate.Bucket) *Store {
	return &Store{authority: authority, copies: copies}
}

// Load reads shard's manifest from the authority with its version. A shard never
// published has the empty manifest and the empty version.
func (s *Store) Load(ctx context.Context, shard string) (Manifest, substrate.Version, error) {
	return load(ctx, s.authority, shard)
}

// LoadFrom reads shard's manifest from any substrate holding a copy.
func LoadFrom(ctx context.Context, b *substrate.Bucket, shard string) (Manifest, error) {
	m, _, err := load(ctx, b, shard)
	return m, err
}

func load(ctx context.Context, b *substrate.Bucket, shard string) (Manifest, substrate.Version, error) {
	data, attrs, err := b.Get(ctx, Key(shard))
	if errors.Is(err, substrate.ErrNotFound) {
		return Manifest{Shard: shard}, "", nil
	}
	if err != nil {
		return Manifest{}, "", fmt.Errorf("manifest %s on %s: %w", shard, b.Name(), err)
	}
	m, err := Decode(data)
	if err != nil {
		return Manifest{}, "", fmt.Errorf("manifest %s on %s: %w", shard, b.Name(), err)
	}
	if m.Shard != shard {
		return Manifest{}, "", fmt.Errorf("manifest %s on %s names shard %q: %w", shard, b.Name(), m.Shard, ErrCorrupt)
	}
	return m, attrs.Version, nil
}

// publish writes m to the authority if its version is still ver (absent when ver is
// empty) and returns the new version; substrate.ErrPreconditionFailed means another
// write came first. The copies are written after the authority; a copy that fails
// does not undo the publish, and the next publish rewrites it.
func (s *Store) publish(ctx context.Context, m Manifest, ver substrate.Version) (substrate.Version, error) {
	data, err := Encode(m)
	if err != nil {
		return "", err
	}
	key := Key(m.Shard)
	var attrs substrate.Attrs
	if ver == "" {
		var created bool
		attrs, created, err = s.authority.PutIfAbsentBytes(ctx, key, data)
		if err == nil && !created {
			err = substrate.ErrPreconditionFailed
		}
	} else {
		attrs, err = s.authority.CompareAndSwapBytes(ctx, key, ver, data)
	}
	if err != nil {
		return "", err
	}
	for _, c := range s.copies {
		c.PutBytes(ctx, key, data) // a failed copy is rewritten by the next publish
	}
	return attrs.Version, nil
}
