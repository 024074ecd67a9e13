package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestARemoteModeReopenCountsUnshippedPagesApartFromStranded: machine A, in Remote
// mode, appends 8 acknowledged records, then 20 more whose tail object cannot be
// put: their append ends with its context (ErrOutcomeUnknown) and the page stays
// in A's WAL, never shipped. A goes down keeping its lease (its close cannot ship
// the tail). Machine B, on its own Dir and client of the shared bucket, waits the
// lease out, fences A's tail, reads the 8 records, appends 4 and retires. When A's
// Dir opens the shard again, its WAL's 20 records are in no one's history: in
// Remote mode they were never acknowledged, so they are counted apart, not as
// stranded (acknowledged records lost).
func TestARemoteModeReopenCountsUnshippedPagesApartFromStranded(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	lease := LeaseOptions{Duration: time.Second, SkewMargin: 100 * time.Millisecond}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(),
		Lease: lease, RenewEvery: 200 * time.Millisecond}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(),
		Lease: lease, RenewEvery: 200 * time.Millisecond}

	eA := open(t, optsA)
	shA := openShard(t, eA, "s")
	acked := appendBatches(t, shA, 2)
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := shA.Append(actx, recs("unshipped", 20)...)
	cancel()
	if !errors.Is(err, shard.ErrOutcomeUnknown) {
		t.Fatalf("an append whose tail object cannot be put: %v, want ErrOutcomeUnknown", err)
	}
	if err := eA.Close(); err == nil {
		t.Fatal("A closed, retiring a shard whose tail it could not ship")
	}

	eB := open(t, optsB)
	shB, err := eB.OpenShard(ctx, "s", WaitForLease())
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, shB, 0); !equal(got, acked) {
		t.Fatalf("B reads %q, want A's acknowledged %q", got, acked)
	}
	if _, err := shB.Append(ctx, recs("b", 4)...); err != nil {
		t.Fatal(err)
	}
	if err := shB.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := eB.Close(); err != nil {
		t.Fatal(err)
	}

	fa.SetRules()
	eA = open(t, optsA)
	openShard(t, eA, "s")
	m := eA.Metrics()
	if m.StrandedRecords != 0 || m.UnacknowledgedRecordsDropped != 20 {
		t.Fatalf("stranded %d, dropped unacknowledged %d; want 0 and the 20 never shipped", m.StrandedRecords, m.UnacknowledgedRecordsDropped)
	}
}
