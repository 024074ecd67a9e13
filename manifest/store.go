package manifest

import (
	"context"
	"errors"
	"fmt"
	"strings"

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

// PartKeyEpoch returns the epoch a part key of shard names (see PartKey), and
// false for a key that is not one.
func PartKeyEpoch(shard, key string) (uint64, bool) {
	rest, ok := strings.CutPrefix(key, PartsPrefix(shard))
	if !ok {
		return 0, false
	}
	var first, next, epoch uint64
	var nonce string
	if n, err := fmt.Sscanf(strings.ReplaceAll(rest, "-", " "), "%d %d e%d %s", &first, &next, &epoch, &nonce); err != nil || n != 4 || first >= next {
		return 0, false
	}
	return epoch, true
}

// LoadFrom reads shard's manifest from any substrate holding a copy.
func LoadFrom(ctx context.Context, b *substrate.Bucket, shard string) (Manifest, error) {
	m, _, _, err := Read(ctx, b, shard)
	return m, err
}

// Read reads shard's manifest from b with its version and its encoding. A shard
// never published has the empty manifest, the empty version and no bytes.
func Read(ctx context.Context, b *substrate.Bucket, shard string) (Manifest, substrate.Version, []byte, error) {
	data, attrs, err := b.Get(ctx, Key(shard))
	if errors.Is(err, substrate.ErrNotFound) {
		return Manifest{Shard: shard}, "", nil, nil
	}
	if err != nil {
		return Manifest{}, "", nil, fmt.Errorf("manifest %s on %s: %w", shard, b.Name(), err)
	}
	m, err := Decode(data)
	if err != nil {
		return Manifest{}, "", nil, fmt.Errorf("manifest %s on %s: %w", shard, b.Name(), err)
	}
	if m.Shard != shard {
		return Manifest{}, "", nil, fmt.Errorf("manifest %s on %s names shard %q: %w", shard, b.Name(), m.Shard, ErrCorrupt)
	}
	return m, attrs.Version, data, nil
}
