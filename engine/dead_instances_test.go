package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestTheTailsOfDeadInstancesAreCollected: 20 instances join, each on its own
// Dir with its own client, append to a shard of its own and die without Close
// (their machines cut off from the store for good). A survivor takes each shard
// over once their leases ran out, and seals it. Its
// collection then ends each dead instance's live incarnation and deletes every
// object of their tails that no manifest needs: what is left of them is at most
// one fence per incarnation (20 zero-byte objects), and no data object.
func TestTheTailsOfDeadInstancesAreCollected(t *testing.T) {
	const n = 20
	ctx := context.Background()
	drv := mem.New()
	dead := make([]*Engine, n)
	cut := make([]*fault.Driver, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cut[i] = fault.Wrap(drv, uint64(i+1))
			e, err := Open(ctx, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", cut[i]), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second})
			if err != nil {
				t.Error(err)
				return
			}
			dead[i] = e
			sh, err := e.OpenShard(ctx, fmt.Sprint("s", i))
			if err != nil {
				t.Error(err)
				return
			}
			for k := range 3 {
				if _, err := sh.Append(ctx, fmt.Appendf(nil, "s%d-%d", i, k)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for i := range n {
		cut[i].SetRules(fault.Rule{Err: fault.ErrInjected}) // the machine is gone
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, e := range dead {
			wg.Go(func() { e.Close() })
		}
		wg.Wait()
	})

	opts := fastCollect(Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second})
	s := open(t, opts)
	for i := range n {
		sh, err := s.OpenShard(ctx, fmt.Sprint("s", i), WaitForLease())
		if err != nil {
			t.Fatalf("the survivor's open of s%d: %v", i, err)
		}
		if got := readAll(t, sh, 0); len(got) != 3 {
			t.Fatalf("s%d holds %d records, want 3", i, len(got))
		}
		if err := sh.Close(ctx); err != nil { // seals
			t.Fatal(err)
		}
	}
	b := substratetest.NewBucket(t, "shared", drv)
	var data, fences int
	waitFor(t, 30*time.Second, "the dead instances' tails collected", func() bool {
		data, fences = deadTailObjects(t, b, dead)
		return data == 0
	})
	t.Logf("left of %d dead instances' tails: %d data objects, %d fences", n, data, fences)
	if fences > n {
		t.Fatalf("%d fences left of %d dead instances with one incarnation each", fences, n)
	}
}

// deadTailObjects counts the data objects and fences of the instances' tails.
func deadTailObjects(t *testing.T, b *substrate.Bucket, engines []*Engine) (data, fences int) {
	t.Helper()
	for _, e := range engines {
		for ent, err := range b.ListAll(t.Context(), "tail/"+e.Instance()+"/") {
			if err != nil {
				t.Fatal(err)
			}
			if ent.Size == 0 {
				fences++
			} else if !strings.HasSuffix(ent.Key, "/") {
				data++
			}
		}
	}
	return data, fences
}
