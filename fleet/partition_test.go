package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// joinShortLease is joinMem with an engine whose instance lease lasts 3 s, so
// that a member cut off from the store stops being one within the test.
func joinShortLease(t *testing.T, drv substrate.Driver, shards []Shard, opts Options) *memMember {
	t.Helper()
	return joinMemWith(t, drv, shards, opts, engine.Options{
		Lease: engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}, RenewEvery: time.Second,
	})
}

// A member cut off from the store (its process as good as dead, its Membership
// unable to leave) loses its leader lease and its instance lease; the other
// member then leads, plans it out, and takes its shards over from the tail,
// losing no acknowledged record.
func TestAPartitionedMembersShardsMoveOnceItsLeaseExpires(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	a := joinShortLease(t, drv, shards, Options{})
	if !eventually(10*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	b := joinShortLease(t, drv, shards, Options{})
	if !eventually(10*time.Second, func() bool { return len(b.m.Owned()) >= 1 && openOn(shards, a, b) }) {
		t.Fatalf("a owns %v, b %v", a.m.Owned(), b.m.Owned())
	}
	time.Sleep(200 * time.Millisecond)
	acked := map[string][]string{}
	for _, s := range shards {
		for _, mm := range []*memMember{a, b} {
			if sh, ok := mm.m.Shard(s.ID); ok {
				for i := range 3 {
					v := fmt.Sprintf("%s-%d", s.ID, i)
					if _, err := sh.Append(t.Context(), []byte(v)); err != nil {
						t.Fatal(err)
					}
					acked[s.ID] = append(acked[s.ID], v)
				}
			}
		}
	}
	t.Logf("before the partition: a owns %v (leader %v), b %v", a.m.Owned(), a.m.Stats().Leader, b.m.Owned())
	a.fd.SetRules(fault.Rule{Err: fault.ErrInjected})
	if !eventually(15*time.Second, func() bool { return openOn(shards, b) }) {
		t.Fatalf("15 s after a was cut off, b owns %v (leader %v)", b.m.Owned(), b.m.Stats().Leader)
	}
	for _, s := range shards {
		sh, _ := b.m.Shard(s.ID)
		seen := map[string]int{}
		for rec, err := range sh.Read(t.Context(), 0) {
			if err != nil {
				t.Fatal(err)
			}
			seen[string(rec.Value)]++
		}
		for _, v := range acked[s.ID] {
			if seen[v] != 1 {
				t.Errorf("shard %s: acknowledged %s read %d times", s.ID, v, seen[v])
			}
		}
	}
	t.Logf("b owns %v; replayed %d", b.m.Owned(), b.m.Stats().ReplayedRecords)
}

// A member whose engine closes without Leave (the server's shutdown forgot it)
// retires its shards and releases its instance lease: the others take them over,
// losing nothing.
func TestAMemberWhoseEngineClosedWithoutLeaveLosesItsShards(t *testing.T) {
	drv := mem.New()
	shards := shardsN(6)
	a := joinShortLease(t, drv, shards, Options{})
	if !eventually(10*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	b := joinShortLease(t, drv, shards, Options{})
	if !eventually(10*time.Second, func() bool { return len(b.m.Owned()) >= 2 && openOn(shards, a, b) }) {
		t.Fatalf("a owns %v, b %v", a.m.Owned(), b.m.Owned())
	}
	appendEach(t, shards, a, b)
	if err := a.e.Close(); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return openOn(shards, b) }) {
		t.Fatalf("10 s after a's engine closed, b owns %v (leader %v; a leader %v)", b.m.Owned(), b.m.Stats().Leader, a.m.Stats().Leader)
	}
	for _, s := range shards {
		sh, _ := b.m.Shard(s.ID)
		n := countRecords(t, sh)
		if n != 1 {
			t.Errorf("shard %s holds %d records, want 1", s.ID, n)
		}
	}
	t.Logf("a leader %v with its engine closed; b leader %v", a.m.Stats().Leader, b.m.Stats().Leader)
}
