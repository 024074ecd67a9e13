package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestASlowReplicaCopyNeverLapsesTheLease: the non-authority replica takes 5 s to
// answer any manifest write, longer than the lease; renewals and appends go on
// against the healthy authority, and Close does not wait for the slow copy beyond
// its deadline.
func TestASlowReplicaCopyNeverLapsesTheLease(t *testing.T) {
	ctx := context.Background()
	slow := fault.Wrap(mem.New(), 1)
	e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "p", Domain: "a", Bucket: substratetest.NewBucket(t, "p", nil)},
		{Name: "r", Domain: "b", Bucket: substratetest.NewBucket(t, "r", slow)}},
		Authority: "p", Seal: quietSealOptions(),
		Lease: LeaseOptions{Duration: 3 * time.Second, SkewMargin: time.Second}, RenewEvery: 200 * time.Millisecond})
	sh := openShard(t, e, "s")
	slow.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent, substrate.OpCompareAndSwap, substrate.OpGet},
		Key: "manifest$", Latency: 5 * time.Second})
	appendBatches(t, sh, 1)
	sealed := make(chan error, 1)
	go func() { _, err := sh.Seal(ctx, 1<<30); sealed <- err }()
	for start := time.Now(); time.Since(start) < 4*time.Second; time.Sleep(50 * time.Millisecond) {
		if _, err := sh.Append(ctx, []byte("y")); err != nil {
			t.Fatalf("after %s with a slow replica: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
	if err := <-sealed; err != nil {
		t.Fatalf("the seal's commit waited on the slow replica: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	// The release lands on the authority; the slow replica does not have it by
	// the deadline, and Close says so.
	if err := sh.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a replica slower than its deadline: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %s with a 200 ms deadline", took)
	}
	if m, _, err := e.store.Load(ctx, "s"); err != nil || !m.Released {
		t.Fatalf("the authority after Close: released %v, %v", m.Released, err)
	}
}

// TestAnAmbiguousCommitStillCopiesThePartToEveryReplica: the seal's commit lands on
// the authority and its reply is lost. Reading the manifest back settles it at
// once; when the read back is lost too, the next seal settles it. Either way the
// part is a commit, with its copies, and no later seal conflicts.
func TestAnAmbiguousCommitStillCopiesThePartToEveryReplica(t *testing.T) {
	for name, rules := range map[string][]fault.Rule{
		"reply lost": {
			{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Err: errors.New("reply lost"), Ambiguous: true}},
		"reply and read back lost": {
			{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Key: "manifest$", Nth: 1, Err: errors.New("reply lost"), Ambiguous: true},
			{Ops: []substrate.Op{substrate.OpGet}, Key: "manifest$", Nth: 1, Err: errors.New("read lost")}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			authFD := fault.Wrap(mem.New(), 1)
			second := substratetest.NewBucket(t, "b", nil)
			e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{
				{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", authFD)}, {Name: "b", Domain: "d2", Bucket: second}},
				Authority: "a", Seal: quietSealOptions(), Upload: replica.Options{BackoffMin: 5 * time.Millisecond, Attempts: 3}})
			sh := openShard(t, e, "s")
			want := appendBatches(t, sh, 2)
			authFD.SetRules(rules...)
			_, err := sh.Seal(ctx, 1<<30)
			authFD.SetRules()
			settledAtOnce := len(rules) == 1
			if settledAtOnce != (err == nil) {
				t.Fatalf("seal: %v", err)
			}
			want = append(want, appendBatches(t, sh, 2)...)
			if _, err := sh.Seal(ctx, 1<<30); err != nil {
				t.Fatalf("the next seal: %v", err)
			}
			flush(t, e)
			parts := sh.Manifest().Parts
			if len(parts) != 2 {
				t.Fatalf("%d parts, want 2", len(parts))
			}
			for _, p := range parts {
				if _, err := second.Attributes(ctx, p.Key); err != nil || len(p.Replicas) != 2 {
					t.Errorf("part %s: named on %v, on b: %v", p.Key, p.Replicas, err)
				}
			}
			m := e.Metrics()
			if m.Seals != 2 || m.Objects != 2 || m.Uploads != 2 || m.Data.UnderReplicated != 0 {
				t.Errorf("seals %d objects %d uploads %d under-replicated %d; want 2, 2, 2, 0", m.Seals, m.Objects, m.Uploads, m.Data.UnderReplicated)
			}
			if !equal(readAll(t, sh, 0), want) {
				t.Error("the history is not what was appended")
			}
		})
	}
}

// TestTheCloseSealIsCounted: the seal a cooperative Close runs is a seal like any
// other in the metrics.
func TestTheCloseSealIsCounted(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	want := appendBatches(t, sh, 3)
	if err := sh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var bytes uint64
	for _, r := range want {
		bytes += uint64(len(r))
	}
	if m := e.Metrics(); m.Seals != 1 || m.Objects != 1 || m.SealedBytes != bytes || m.SealFailures != 0 {
		t.Fatalf("seals %d objects %d sealed bytes %d failures %d; want 1, 1, %d, 0", m.Seals, m.Objects, m.SealedBytes, m.SealFailures, bytes)
	}
}

// TestAPartAlreadyThereAtSealIsTheSealsOwnPut: the part's put lands and its reply
// is lost; the client's retry finds the object. That is the seal's own put, not a
// failure.
func TestAPartAlreadyThereAtSealIsTheSealsOwnPut(t *testing.T) {
	fd := fault.Wrap(mem.New(), 1)
	e := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "m", fd), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	appendBatches(t, sh, 2)
	// An ambiguous precondition failure is what a retried put-if-absent whose
	// first attempt landed reports.
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/parts/", Nth: 1, Ambiguous: true, Err: substrate.ErrPreconditionFailed})
	if _, err := sh.Seal(context.Background(), 1<<30); err != nil {
		t.Fatal(err)
	}
	if m := e.Metrics(); m.Seals != 1 || m.SealFailures != 0 {
		t.Fatalf("seals %d failures %d", m.Seals, m.SealFailures)
	}
}
