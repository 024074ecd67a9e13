package fleet

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// Member a, alone in its fleet, serves s00. a is cut off from the store until its
// instance lease runs out, and machine x (an engine on its own Dir, no member)
// takes s00 over and closes it. a comes back: its lease renewed in a new
// generation, its handle of s00 is fenced, while s00 stays assigned to a. First
// a's reads of the fleet's objects still fail, so only its claim runs: it must not
// claim s00 on the fenced handle. Then a is whole: it must drop the fenced handle
// and open s00 again, so that s00 is served.
func TestAMemberReopensAShardWhoseHandleWasFenced(t *testing.T) {
	ctx := t.Context()
	drv := mem.New()
	shards := shardsN(1)
	short := engine.Options{
		Lease: engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}, RenewEvery: time.Second,
	}
	a := joinMemWith(t, drv, shards, Options{}, short)
	if !eventually(10*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	old, _ := a.m.Shard("s00")
	if _, err := old.Append(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}

	a.fd.SetRules(fault.Rule{Err: fault.ErrInjected})
	x := memMachineWith(t, short, drv)
	sh, err := x.OpenShard(ctx, "s00", engine.WaitForLease())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Append(ctx, []byte("x's")); err != nil {
		t.Fatal(err)
	}
	if err := sh.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// a's writes and shard reads come back; its reads of the fleet's objects
	// (the assignment) still fail, so that it follows nothing yet.
	a.fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Key: "^fleet/", Err: fault.ErrInjected})
	if !eventually(10*time.Second, old.Fenced) {
		t.Fatal("a's handle of s00 was never found fenced")
	}
	reader, err := substrate.New(drv, substrate.Options{Name: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	var claimed string
	if !eventually(5*time.Second, func() bool {
		r, _, err := lease.Read(ctx, reader, lease.InstanceKey(a.m.ID()))
		claimed = r.Attrs[attrShards]
		return err == nil && !slices.Contains(strings.Split(claimed, ","), "s00")
	}) {
		t.Errorf("5 s after a's handle of s00 was fenced, a's lease still claims s00 (%q), whose handle is fenced", claimed)
	}

	a.fd.SetRules()
	var lastErr error
	if !eventually(10*time.Second, func() bool {
		sh, ok := a.m.Shard("s00")
		if !ok {
			return false
		}
		_, lastErr = sh.Append(ctx, []byte("after"))
		return lastErr == nil
	}) {
		p, _, _ := readAssignment(ctx, reader, "default")
		t.Fatalf("10 s after a healed, nobody serves s00: assigned to %s (a is %s), a lists %v as open; the last append: %v (fenced: %v)",
			p.Shards["s00"], a.m.ID(), a.m.Owned(), lastErr, errors.Is(lastErr, engine.ErrFenced))
	}
}
