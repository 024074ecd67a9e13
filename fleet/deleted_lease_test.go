package fleet

import (
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// A member's instance lease object is deleted from the store (an operator, a
// lifecycle rule): the member's next renewal writes it back with the fleet's
// attributes (its fleet, its weight, the shards it claims), so that the leader
// counts it a member again. Also when, before that renewal, another machine's
// takeover attempt found the object gone and wrote it back itself, knowing no
// attributes. Holds: a renewal that finds the object gone writes the whole record
// it holds anew, and one that finds a record of its own token written over it
// writes over it in turn; kept as proof.
func TestADeletedInstanceLeaseIsWrittenBackWithTheFleetsAttributes(t *testing.T) {
	for _, how := range []string{"deleted", "deleted and written back by a reader"} {
		t.Run(how, func(t *testing.T) {
			ctx := t.Context()
			drv := mem.New()
			shards := shardsN(1)
			short := engine.Options{
				Lease: engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}, RenewEvery: time.Second,
			}
			a := joinMemWith(t, drv, shards, Options{Weight: 2}, short)
			if !eventually(10*time.Second, func() bool { return openOn(shards, a) }) {
				t.Fatalf("a owns %v", a.m.Owned())
			}
			reader, err := substrate.New(drv, substrate.Options{Name: "reader"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { reader.Close() })
			key := lease.InstanceKey(a.m.ID())
			claims := func() (lease.Record, bool) {
				r, _, err := lease.Read(ctx, reader, key)
				return r, err == nil && r.Attrs[attrFleet] == "default" && r.Attrs[attrWeight] == "2" && r.Attrs[attrShards] == "s00"
			}
			if !eventually(5*time.Second, func() bool { _, ok := claims(); return ok }) {
				r, _ := claims()
				t.Fatalf("a's lease never claimed s00: %+v", r)
			}

			if err := reader.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			deleted := time.Now()
			if how != "deleted" {
				x := memMachineWith(t, short, drv)
				if _, err := x.OpenShard(ctx, "s00"); err == nil {
					t.Fatal("x took s00 from a live member")
				}
				if r, _, err := lease.Read(ctx, reader, key); err != nil || r.Holder != a.m.ID() {
					t.Fatalf("x's takeover attempt did not write a's lease back: %+v, %v", r, err)
				}
			}
			var r lease.Record
			if !eventually(3*short.RenewEvery, func() (ok bool) { r, ok = claims(); return ok }) {
				t.Fatalf("%s after a's lease object was %s, it holds %+v: not a's fleet attributes", 3*short.RenewEvery, how, r)
			}
			t.Logf("a's lease back with its attributes %s after it was %s", time.Since(deleted).Round(time.Millisecond), how)
			if p, _, err := readAssignment(ctx, reader, "default"); err != nil || p.Shards["s00"] != a.m.ID() {
				t.Fatalf("s00 is assigned to %q, a is %s (%v)", p.Shards["s00"], a.m.ID(), err)
			}
		})
	}
}
