package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

var errMachineDown = errors.New("test: machine A lost power")

// reincarnationCrashPoints are the steps of a fenced engine's move to its next
// incarnation, each as the call of A's that is its last before the power goes.
var reincarnationCrashPoints = []struct {
	name string
	rule func(inst string, next uint64) fault.Rule
	// landed names what the store holds once the call was made.
	landed func(c tail.Chain, next uint64, objects []string) bool
}{
	{
		name: "before the chain write lands",
		rule: func(string, uint64) fault.Rule {
			return fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "/tail-chain$", Nth: 1, Err: errMachineDown, Last: true}
		},
		landed: func(c tail.Chain, next uint64, _ []string) bool { live, _ := c.Live(); return live.N < next },
	},
	{
		name: "after the chain write landed, before its reply",
		rule: func(string, uint64) fault.Rule {
			return fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "/tail-chain$", Nth: 1, Err: errMachineDown, Ambiguous: true, Last: true}
		},
		landed: func(c tail.Chain, next uint64, objects []string) bool {
			live, _ := c.Live()
			return live.N == next && len(objects) == 0
		},
	},
	{
		name: "after the new incarnation's first object landed, before its reply",
		rule: func(inst string, next uint64) fault.Rule {
			return fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: fmt.Sprintf("^tail/%s/%020d/", inst, next), Nth: 1, Err: errMachineDown, Ambiguous: true, Last: true}
		},
		landed: func(c tail.Chain, next uint64, objects []string) bool {
			live, _ := c.Live()
			return live.N == next && len(objects) == 1
		},
	},
}

// TestACrashAtEachStepOfAReincarnationLosesNoAcknowledgedRecord: machine A, with
// shards x and y, has its tail fenced by a takeover of another of its shards, and
// loses power at each step of its move to the next incarnation (before the chain
// write lands, after it landed, after the new incarnation's first object landed),
// with appends to x and y in flight. Then either A restarts on what its disk
// synced, or B, on another machine, takes x and y over once A's lease ran out.
// Every record acknowledged is read back at its offset: in Remote mode by both;
// in Local mode by A's restart, and by B those acknowledged and shipped before
// the fence (Local acknowledgements A had not shipped are the window a machine's
// loss may cost).
func TestACrashAtEachStepOfAReincarnationLosesNoAcknowledgedRecord(t *testing.T) {
	short := LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}
	for _, p := range reincarnationCrashPoints {
		for _, d := range []Durability{Remote, Local} {
			for _, after := range []string{"A restarts", "B takes over"} {
				t.Run(fmt.Sprintf("%s/%s/%s", p.name, d, after), func(t *testing.T) {
					t.Parallel()
					ctx := context.Background()
					drv := mem.New()
					fa := fault.Wrap(drv, 1)
					fsA, clkA, clkB := vfs.NewCrashableMem(), testclock.New(), testclock.New()
					optsA := Options{Dir: "a", FS: fsA, Clock: clkA, Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Durability: d, Lease: short, RenewEvery: 500 * time.Millisecond}
					optsB := Options{Dir: t.TempDir(), Clock: clkB, Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 2)), Seal: quietSealOptions(), Durability: d, Lease: short, RenewEvery: 500 * time.Millisecond}
					eA, err := Open(ctx, optsA)
					if err != nil {
						t.Fatal(err)
					}
					x, y := openShard(t, eA, "x"), openShard(t, eA, "y")
					acked := map[string]map[uint64][]byte{"x": {}, "y": {}}
					appendAcked(t, x, acked["x"], recs("x", 3)...)
					appendAcked(t, y, acked["y"], recs("y", 3)...)
					waitFor(t, 5*time.Second, "A's tail shipped", func() bool { return eA.Metrics().TailUnshippedBytes == 0 })

					inst, inc := eA.Instance(), eA.tail.Incarnation()
					fa.SetRules(p.rule(inst, inc+1))
					if _, _, err := tail.Fence(ctx, optsB.Bucket, inst, inc, 0); err != nil {
						t.Fatal(err)
					}
					var mu sync.Mutex
					var wg sync.WaitGroup
					for id, sh := range map[string]*shard.Shard{"x": x, "y": y} {
						for i := range 2 {
							wg.Go(func() {
								actx, cancel := context.WithTimeout(ctx, 2*time.Second)
								defer cancel()
								r := fmt.Appendf(nil, "%s during the move %d", id, i)
								if off, err := sh.Append(actx, r); err == nil {
									mu.Lock()
									acked[id][off] = r
									mu.Unlock()
								}
							})
						}
					}
					waitFor(t, 5*time.Second, "A's last call", func() bool { return fa.Injected() > 0 })
					// The power goes: A's disk keeps what it synced, A calls no more.
					crashed := fsA.CrashClone(vfs.CrashCloneCfg{})
					wg.Wait()
					// The dead engine's Close can release nothing: it gives up after
					// the lease's duration.
					closed := make(chan error, 1)
					go func() { closed <- eA.Close() }()
					defer func() {
						select {
						case <-closed:
						case <-time.After(30 * time.Second):
							t.Error("the dead engine's Close did not return")
						}
					}()

					c, _, err := tail.ReadChain(ctx, optsB.Bucket, inst)
					if err != nil {
						t.Fatal(err)
					}
					var objs []string
					for ent, err := range optsB.Bucket.ListAll(ctx, fmt.Sprintf("tail/%s/%020d/", inst, inc+1)) {
						if err != nil {
							t.Fatal(err)
						}
						objs = append(objs, ent.Key)
					}
					if !p.landed(c, inc+1, objs) {
						t.Fatalf("A lost power elsewhere than %s: chain %+v, objects of incarnation %d: %v", p.name, c, inc+1, objs)
					}

					var reader *Engine
					if after == "A restarts" {
						optsA.FS = crashed
						optsA.Bucket = substratetest.NewBucket(t, "shared", fault.Wrap(drv, 3))
						reader = open(t, optsA)
					} else {
						clkB.Advance(time.Minute) // past A's lease and the skew margin
						reader = open(t, optsB)
						if d == Local {
							// Only what A shipped before the fence is promised.
							for id := range acked {
								for off := range acked[id] {
									if off >= 3 {
										delete(acked[id], off)
									}
								}
							}
						}
					}
					for _, id := range []string{"x", "y"} {
						sh, err := reader.OpenShard(ctx, id)
						if err != nil {
							t.Fatalf("%s: open %s: %v", after, id, err)
						}
						checkAcked(t, after+": "+id, readAll(t, sh, 0), acked[id])
					}
				})
			}
		}
	}
}
