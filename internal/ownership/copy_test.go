package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// TestALateManifestCopyNeverMovesAReplicaBack: owner A's copy of its release to the
// replica is slow; B, another machine, takes the shard over, commits and releases,
// and its copies land first. A's copy then arrives and must leave B's manifest: a
// cold open from the replica would otherwise read A's shorter history as complete.
func TestALateManifestCopyNeverMovesAReplicaBack(t *testing.T) {
	ctx := context.Background()
	authDrv, replicaDrv := mem.New(), mem.New()
	slowToReplica := fault.Wrap(replicaDrv, 1)
	stA := NewStore(bucket(t, "auth", authDrv), bucket(t, "replica", slowToReplica))
	stB := NewStore(bucket(t, "auth", authDrv), bucket(t, "replica", replicaDrv))
	t.Cleanup(stA.Close)
	t.Cleanup(stB.Close)
	replica := bucket(t, "replica", replicaDrv)

	a := acquire(t, stA)
	if err := a.Commit(ctx, part(0, 4)); err != nil {
		t.Fatal(err)
	}
	if err := stA.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// From now on A's writes of the manifest to the replica take 500 ms.
	slowToReplica.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap},
		Key: "manifest$", Latency: 500 * time.Millisecond})
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}

	b, _, err := Acquire(ctx, stB, "s", instance(t, stB, "B", LeaseOptions{}), LeaseOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx, part(4, 4)); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitCopies(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitCopies(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.LoadFrom(ctx, replica, "s")
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != b.Epoch() || m.Sealed != 8 || m.Owner != "B" {
		t.Fatalf("the replica holds epoch %d owner %q sealed %d; B published epoch %d sealed 8", m.Epoch, m.Owner, m.Sealed, b.Epoch())
	}
}

// TestASlowReplicaNeverHoldsUpAPublish: a replica that takes far longer than a
// lease to answer delays no renewal, commit or release; the copy lands later.
func TestASlowReplicaNeverHoldsUpAPublish(t *testing.T) {
	ctx := context.Background()
	replicaDrv := mem.New()
	slow := fault.Wrap(replicaDrv, 1, fault.Rule{Key: "manifest$", Latency: 2 * time.Second})
	st := NewStore(bucket(t, "auth", nil), bucket(t, "replica", slow))
	t.Cleanup(st.Close)
	o := acquire(t, st)
	start := time.Now()
	for i := range 5 {
		if err := o.Commit(ctx, part(uint64(i), 1)); err != nil {
			t.Fatal(err)
		}
		if err := o.Confirm(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("10 publishes took %s behind a replica that answers in 2 s", took)
	}
	if err := o.WaitCopies(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.LoadFrom(ctx, bucket(t, "replica", replicaDrv), "s")
	if err != nil || m.Sealed != 5 || m.Seq != o.Manifest().Seq {
		t.Fatalf("the replica holds %+v, %v; want the last publish", m, err)
	}
}

// TestABlackHoledReplicaDoesNotHoldUpClose: copies in flight to a replica that
// never answers end when the Store closes.
func TestABlackHoledReplicaDoesNotHoldUpClose(t *testing.T) {
	ctx := context.Background()
	hole := fault.Wrap(mem.New(), 1, fault.Rule{Latency: time.Hour})
	st := NewStore(bucket(t, "auth", nil), bucket(t, "replica", hole))
	o := acquire(t, st)
	if err := o.Commit(ctx, part(0, 1)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := o.WaitCopies(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for a copy that cannot land: %v", err)
	}
	done := make(chan struct{})
	go func() { st.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits on a replica that never answers")
	}
}
