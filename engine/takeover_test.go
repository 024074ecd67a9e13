package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// supersede leaves machine A's WAL holding 10 acknowledged records of shard "s"
// that machine B then superseded: A appends in Local mode while its tail cannot be
// shipped, and goes down keeping the lease; B, on its own Dir and client, waits for
// the lease, fences A's tail, appends 4 records and retires (they stay in B's tail).
// It returns A's options (its bucket goes through fd) and B's records.
func supersede(t *testing.T) (Options, *fault.Driver, [][]byte) {
	t.Helper()
	ctx := context.Background()
	drv := mem.New()
	fd := fault.Wrap(drv, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	lease := LeaseOptions{Duration: time.Second, SkewMargin: 100 * time.Millisecond}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "p", fd), Seal: quietSealOptions(),
		Durability: Local, Lease: lease, RenewEvery: 200 * time.Millisecond}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "p", drv), Seal: quietSealOptions(),
		Lease: lease, RenewEvery: 200 * time.Millisecond}

	eA := open(t, optsA)
	appendBatches(t, openShard(t, eA, "s"), 10)
	if err := eA.Close(); err == nil {
		t.Fatal("A closed, retiring a shard whose tail it could not ship")
	}
	eB := open(t, optsB)
	shB, err := eB.OpenShard(ctx, "s", WaitForLease())
	if err != nil {
		t.Fatal(err)
	}
	want := recs("b", 4) // unlike any of A's
	if _, err := shB.Append(ctx, want...); err != nil {
		t.Fatal(err)
	}
	if err := shB.Retire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := eB.Close(); err != nil {
		t.Fatal(err)
	}
	fd.SetRules()
	return optsA, fd, want
}

// TestATakeoverWhoseReplyWasLostDropsSupersededPages: A takes the shard back; its
// takeover lands on the authority but the reply is lost, whether the client
// reports a precondition failure (its own retry) or an error. The manifest then
// names A at the WAL's epoch, which is what "these pages are ours" looks like: the
// decision must have been made, and the superseded pages dropped, before.
func TestATakeoverWhoseReplyWasLostDropsSupersededPages(t *testing.T) {
	for name, lost := range map[string]error{
		"reported as a precondition failure": substrate.ErrPreconditionFailed,
		"reported as an error":               fault.ErrInjected,
	} {
		t.Run(name, func(t *testing.T) {
			optsA, fd, want := supersede(t)
			fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Ambiguous: true, Err: lost})
			eA := open(t, optsA)
			sh, err := eA.OpenShard(context.Background(), "s")
			if err != nil {
				t.Fatalf("the takeover landed, and reading back says so: %v", err)
			}
			if got := readAll(t, sh, 0); !equal(got, want) {
				t.Fatalf("history %q, want B's %q alone", got, want)
			}
			if n := eA.Metrics().StrandedRecords; n != 40 {
				t.Fatalf("%d records counted stranded, want A's 40", n)
			}
		})
	}
}

// TestATakeoverInterruptedBeforeAdoptionDropsSupersededPages: A's takeover lands,
// and A stops before it settles its WAL (here: the reply and the read back are
// lost, and A's engine goes down). When A's Dir opens again, the manifest names A
// at the WAL's epoch; the superseded pages must be gone already.
func TestATakeoverInterruptedBeforeAdoptionDropsSupersededPages(t *testing.T) {
	ctx := context.Background()
	optsA, fd, want := supersede(t)
	fd.SetRules(
		fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Ambiguous: true, Err: fault.ErrInjected},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Key: "manifest$", Nth: 2, Err: fault.ErrInjected})
	eA, err := Open(ctx, optsA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eA.OpenShard(ctx, "s"); err == nil {
		t.Fatal("the takeover's outcome could not be known, and the open succeeded")
	}
	if err := eA.Close(); err != nil {
		t.Fatal(err)
	}
	fd.SetRules()
	eA = open(t, optsA)
	if got := readAll(t, openShard(t, eA, "s"), 0); !equal(got, want) {
		t.Fatalf("history %q, want B's %q alone", got, want)
	}
}

// TestConcurrentOpensOfOneDirKeepOneInstance: two opens of a new Dir race; the one
// that wins holds leases under the id Dir/instance keeps, so after a restart its
// unsealed records are still its own.
func TestConcurrentOpensOfOneDirKeepOneInstance(t *testing.T) {
	ctx := context.Background()
	for i := range 100 {
		dir := t.TempDir()
		b := bucketFor(t, dir)
		var wg sync.WaitGroup
		engines := make([]*Engine, 2)
		for k := range engines {
			wg.Go(func() {
				if e, err := Open(ctx, Options{Dir: dir, Bucket: b, Seal: quietSealOptions()}); err == nil {
					engines[k] = e
				}
			})
		}
		wg.Wait()
		var e *Engine
		for _, c := range engines {
			if c != nil {
				if e != nil {
					t.Fatal("two engines opened one Dir")
				}
				e = c
			}
		}
		if e == nil {
			t.Fatal("neither open succeeded")
		}
		raw, err := os.ReadFile(filepath.Join(dir, "instance"))
		if err != nil {
			t.Fatal(err)
		}
		if kept := strings.TrimSpace(string(raw)); kept != e.Instance() {
			e.Close()
			t.Fatalf("iteration %d: the open engine holds leases as %s, Dir/instance keeps %s", i, e.Instance(), kept)
		}
		if i > 0 {
			e.Close()
			continue
		}
		want := appendBatches(t, openShard(t, e, "s"), 2)
		if err := e.Close(); err != nil { // retires: the records stay in the WAL
			t.Fatal(err)
		}
		e = open(t, Options{Dir: dir, Bucket: b, Seal: quietSealOptions()})
		if got := readAll(t, openShard(t, e, "s"), 0); !equal(got, want) {
			t.Fatalf("after a restart: %d records, want %d", len(got), len(want))
		}
		e.Close()
	}
}

// TestAReopenOnAReplicaSetKeepsItsBacklog guards the takeover's early decision
// from the other side: pages that are ours stay, whatever the replica set.
func TestAReopenOnAReplicaSetKeepsItsBacklog(t *testing.T) {
	dir := t.TempDir()
	specs := []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", nil)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", nil)}}
	opts := Options{Dir: dir, Replicas: specs, Authority: "a", Seal: quietSealOptions()}
	want := leaveUnsealed(t, opts, "s")
	e := open(t, opts)
	sh := openShard(t, e, "s")
	if got := readAll(t, sh, 0); !equal(got, want) {
		t.Fatalf("%d records after the reopen, want %d", len(got), len(want))
	}
	if n := e.Metrics().StrandedRecords; n != 0 {
		t.Fatalf("%d records stranded", n)
	}
	if err := sh.Close(context.Background()); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestAnOpenOnAMissingBucketFailsInsteadOfStartingEmpty: a store whose bucket is
// gone is not a store of new shards; an open that read it as one would hand out
// offsets from 0 again.
func TestAnOpenOnAMissingBucketFailsInsteadOfStartingEmpty(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	drv, err := local.New(root)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "local", drv), Seal: quietSealOptions()}
	e := open(t, opts)
	appendBatches(t, openShard(t, e, "s"), 1)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	e = open(t, opts)
	if _, err := e.OpenShard(ctx, "s"); !errors.Is(err, substrate.ErrBucketNotFound) {
		t.Fatalf("open on a removed bucket: %v, want ErrBucketNotFound", err)
	}
}
