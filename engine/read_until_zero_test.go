package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/shard"
)

// TestUntilZeroYieldsNothing: Until(end) promises the records below end and no
// others, so Until(0) bounds a read to nothing. A caller that snapshots a shard
// with Until(sh.Info().Readable) passes 0 for a shard with nothing readable yet;
// it must get nothing, and with Follow an immediate end, not a read without a
// bound.
//
// The interleaving: the reader takes Readable (0) of an empty shard, an append
// of four records is acknowledged, then the read with Until(0) runs. Expected:
// no record, and the following read ends at once. Found: readOptions treats
// until = 0 as "no bound", so the plain read yields the four records at offsets
// 0 to 3, all at or past the bound, and the following read waits for more
// instead of ending.
func TestUntilZeroYieldsNothing(t *testing.T) {
	ctx := context.Background()
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	end := sh.Info().Readable
	if end != 0 {
		t.Fatalf("an empty shard's Readable is %d", end)
	}
	appendBatches(t, sh, 1)

	var got []uint64
	for rec, err := range sh.Read(ctx, 0, shard.Until(end)) {
		if err != nil {
			t.Fatalf("read until %d: %v", end, err)
		}
		got = append(got, rec.Offset)
	}
	if len(got) > 0 {
		t.Errorf("a read until %d yielded offsets %v, none of them below %d", end, got, end)
	}

	fctx, cancel := context.WithTimeout(ctx, 2*time.Second) // a liveness bound
	defer cancel()
	var followed []uint64
	var ended error
	for rec, err := range sh.Read(fctx, 0, shard.Until(end), shard.Follow()) {
		if err != nil {
			ended = err
			break
		}
		followed = append(followed, rec.Offset)
	}
	if len(followed) > 0 || ended != nil {
		t.Errorf("a following read until %d yielded offsets %v and ended with %v; want nothing and an end without an error", end, followed, ended)
	}
}
