package fleet

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate/mem"
)

// Every member leaves at once, with their engines open: afterwards no shard, no
// scan shard and no leader lease is held, and a fresh engine opens every shard at
// once.
func TestAfterEveryMemberLeftNothingIsHeld(t *testing.T) {
	drv := mem.New()
	shards := shardsN(9)
	var ms []*memMember
	for range 3 {
		ms = append(ms, joinMem(t, drv, shards, Options{ScanShards: 3, ScanEvery: 100 * time.Millisecond}))
	}
	if !eventually(10*time.Second, func() bool {
		for _, mm := range ms {
			if len(mm.m.Owned()) < 2 {
				return false
			}
		}
		return openOn(shards, ms...)
	}) {
		t.Fatal("the fleet did not settle")
	}
	appendEach(t, shards, ms...)
	var wg sync.WaitGroup
	for _, mm := range ms {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := mm.m.Leave(ctx); err != nil {
				t.Errorf("leave %s: %v", mm.m.ID(), err)
			}
		})
	}
	wg.Wait()
	at := time.Now()
	b := ms[0].e.Authority()
	for _, key := range []string{leaderKey("default"), scanKey("default", 0, 3), scanKey("default", 1, 3), scanKey("default", 2, 3)} {
		r, _, err := lease.Read(t.Context(), b, key)
		if err != nil {
			t.Fatal(err)
		}
		if r.Live(at, 0) {
			t.Errorf("%s is still held by %s after every member left", key, r.Holder)
		}
	}
	fresh := memMachine(t, drv)
	for _, s := range shards {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		sh, err := fresh.OpenShard(ctx, s.ID)
		cancel()
		if err != nil {
			t.Errorf("open %s after every member left: %v", s.ID, err)
			continue
		}
		n := countRecords(t, sh)
		if n != 1 {
			t.Errorf("shard %s holds %d records, want 1", s.ID, n)
		}
		if err := sh.Close(t.Context()); err != nil {
			t.Error(err)
		}
	}
	if r := fresh.Metrics().TailRecordsTaken; r != 0 {
		t.Errorf("the fresh engine read %d records from a tail: some handoff at Leave was not cooperative", r)
	}
	_ = fmt.Sprint
}
