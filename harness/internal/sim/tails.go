package sim

import (
	"bytes"
	"context"
	"strconv"
	"strings"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// tails watches the store's tail objects between steps: it reads the index of
// each one when it first appears, and when one is gone it checks that no
// manifest still needed it. A manifest needs an object of the instance its tail
// pointer names, at or past the pointer's position (in its incarnation or a
// later one) and before its recorded end, that holds a section of the
// manifest's epoch past the sealed watermark: the next owner reads it there.
type tails struct {
	b     *substrate.Bucket // the store, without faults
	store *ownership.Store
	seen  map[string][]tail.Entry
}

func newTails(w *world) (*tails, error) {
	b, err := substrate.New(w.store, substrate.Options{Name: "observer"})
	if err != nil {
		return nil, err
	}
	return &tails{b: b, store: ownership.NewStore(b), seen: map[string][]tail.Entry{}}, nil
}

// check looks at the store now.
func (t *tails) check(w *world) {
	ctx := context.Background()
	now := map[string]bool{}
	for a, err := range t.b.ListAll(ctx, "tail/") {
		if err != nil {
			w.violate("list the tails: %v", err)
			return
		}
		now[a.Key] = true
		if _, ok := t.seen[a.Key]; ok || a.Size == 0 {
			continue // known, or a fence
		}
		data, _, err := t.b.Get(ctx, a.Key)
		if err != nil {
			continue // deleted meanwhile: never seen
		}
		ix, err := tail.ReadIndex(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			w.violate("tail object %s does not decode: %v", a.Key, err)
			return
		}
		t.seen[a.Key] = ix.Entries
	}
	for key, entries := range t.seen {
		if now[key] {
			continue
		}
		delete(t.seen, key)
		instance, incarnation, seq, ok := parseTailKey(key)
		if !ok {
			continue
		}
		for _, e := range entries {
			m, _, err := t.store.Load(ctx, e.Shard)
			if err != nil {
				continue
			}
			p := m.Tail
			if p != nil && p.Instance == instance && !before(incarnation, seq, p.Incarnation, p.From) &&
				(p.Until == 0 || before(incarnation, seq, untilIncarnation(p), p.Until)) && e.Epoch == m.Epoch && e.Next > m.Sealed {
				w.violate("collection deleted %s, which shard %s still needs: its records %d to %d of epoch %d, sealed to %d, pointer %+v",
					key, e.Shard, e.First, e.Next-1, e.Epoch, m.Sealed, *p)
				return
			}
		}
	}
}

// before reports whether position (i, s) of a tail comes before (oi, os).
func before(i, s, oi, os uint64) bool { return i < oi || (i == oi && s < os) }

// untilIncarnation is the incarnation of a tail pointer's recorded end.
func untilIncarnation(p *manifest.Tail) uint64 {
	if p.UntilIncarnation != 0 {
		return p.UntilIncarnation
	}
	return p.Incarnation
}

// parseTailKey splits tail/<instance>/<incarnation>/<sequence>.
func parseTailKey(key string) (instance string, incarnation, seq uint64, ok bool) {
	parts := strings.Split(key, "/")
	if len(parts) != 4 || parts[0] != "tail" {
		return "", 0, 0, false
	}
	inc, err1 := strconv.ParseUint(parts[2], 10, 64)
	s, err2 := strconv.ParseUint(parts[3], 10, 64)
	return parts[1], inc, s, err1 == nil && err2 == nil
}
