package engine

import (
	"context"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestAPartAlreadyThereAtSealIsTheSealsOwnPutOnADirectBucket is
// TestAPartAlreadyThereAtSealIsTheSealsOwnPut on a single local replica, where the
// seal is Direct: the same injected fault (the object landed, the reply is the
// precondition failure a retried put-if-absent reports) must still be the seal's
// own put, not a failure.
func TestAPartAlreadyThereAtSealIsTheSealsOwnPutOnADirectBucket(t *testing.T) {
	drv, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(drv, 1)
	b := substratetest.NewBucket(t, "m", fd)
	if !b.Streams() {
		t.Fatal("a local bucket does not stream")
	}
	e := open(t, Options{Dir: t.TempDir(), Bucket: b, Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	appendBatches(t, sh, 2)
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/parts/", Nth: 1, Ambiguous: true, Err: substrate.ErrPreconditionFailed})
	_, serr := sh.Seal(context.Background(), 1<<30)
	parts := substratetest.CountObjects(t, b, "shards/s/parts/")
	m := e.Metrics()
	if serr != nil || m.Seals != 1 || m.SealFailures != 0 {
		t.Fatalf("seal err %v; seals %d failures %d; %d part objects in the bucket, %d named by the manifest",
			serr, m.Seals, m.SealFailures, parts, len(sh.Manifest().Parts))
	}
}

// The cooperative Close on a Direct bucket: the same fault on the close seal's part
// makes Close fail and keep the lease, where the file path hands the shard over.
func TestACloseWhosePartIsAlreadyThereHandsOverOnADirectBucket(t *testing.T) {
	drv, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(drv, 1)
	b := substratetest.NewBucket(t, "m", fd)
	e := open(t, Options{Dir: t.TempDir(), Bucket: b, Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	appendBatches(t, sh, 2)
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/parts/", Nth: 1, Ambiguous: true, Err: substrate.ErrPreconditionFailed})
	if err := sh.Close(context.Background()); err != nil {
		t.Fatalf("close: %v (released: %v)", err, sh.Manifest().Released)
	}
}
