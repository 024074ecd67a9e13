package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// wireDriver holds one armed conditional write "on the wire": its client gives up
// at once (a timeout), while the store applies the request later, when the test
// lands it.
type wireDriver struct {
	substrate.Driver
	mu      sync.Mutex
	key     *regexp.Regexp
	pending func() error
}

var errGaveUp = errors.New("the client gave up waiting (the request is still in flight)")

func (d *wireDriver) arm(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = regexp.MustCompile(key)
}

func (d *wireDriver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	d.mu.Lock()
	if d.key == nil || !d.key.MatchString(key) || (!cond.IfAbsent && cond.IfMatch == "") {
		d.mu.Unlock()
		return d.Driver.Put(ctx, key, body, cond)
	}
	defer d.mu.Unlock()
	data, err := io.ReadAll(body)
	if err != nil {
		return substrate.Attrs{}, err
	}
	d.key = nil
	d.pending = func() error {
		_, err := d.Driver.Put(context.Background(), key, bytes.NewReader(data), cond)
		return err
	}
	return substrate.Attrs{}, errGaveUp
}

// land applies the write held on the wire and returns its outcome.
func (d *wireDriver) land(t *testing.T) error {
	t.Helper()
	d.mu.Lock()
	p := d.pending
	d.pending = nil
	d.mu.Unlock()
	if p == nil {
		t.Fatal("no write on the wire")
	}
	return p()
}

// lateLease is short, so that the bounds of the tests of takeovers and restarts
// are a few seconds.
var lateLease = LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}

// refuseShardWrites makes fa refuse every conditional write of a shard's
// manifest: an engine's releases and takeovers fail, as on a machine cut off from
// the store.
func refuseShardWrites(fa *fault.Driver) {
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap, substrate.OpPutIfAbsent}, Key: "^shards/", Err: fault.ErrInjected})
}

// lateMachines returns the options of two engines on their own Dirs, over one
// shared bucket; B's client goes through the returned wire driver.
func lateMachines(t *testing.T) (Options, Options, *wireDriver) {
	drv := mem.New()
	wire := &wireDriver{Driver: drv}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", wire), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
	return optsA, optsB, wire
}

// openWithin opens shard id on e, retrying while another instance owns it, for at
// most bound.
func openWithin(t *testing.T, e *Engine, id string, bound time.Duration, why string) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		sh, err := e.OpenShard(context.Background(), id)
		if err == nil {
			if _, err := sh.Append(context.Background(), []byte("A's")); err != nil {
				t.Fatal(err)
			}
			return
		}
		if !errors.Is(err, ErrOwned) || time.Now().After(deadline) {
			t.Fatalf("%s after %s, A still cannot open %s: %v", bound, why, id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// B's takeover of a new shard x is sent and stays on the wire; its client gives up,
// and reading back finds no manifest. The write lands a moment later: x names B's
// live instance lease, and B has it open nowhere. B's open must say its outcome is
// unknown, and B gives x back after a renewal: A opens x within a few lease
// durations.
func TestALateTakeoverWriteIsKeptAsAnOrphan(t *testing.T) {
	optsA, optsB, wire := lateMachines(t)
	eA, eB := open(t, optsA), open(t, optsB)
	wire.arm(`^shards/x/manifest$`)
	_, err := eB.OpenShard(context.Background(), "x")
	if !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Errorf("B's open of x, its takeover's write still on the wire: %v; want ErrUnknownOutcome", err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := wire.land(t); err != nil {
		t.Fatalf("the late takeover write: %v", err)
	}
	openWithin(t, eA, "x", 5*lateLease.Duration, "B's takeover landed late")
}

// The same of BackfillIdle's takeover: a shard released with a part lacking a
// replica, which B takes over to copy it. The takeover's write lands after its
// read-back found the released manifest; B gives the shard back, and A opens it
// again with its record.
func TestABackfillsLateTakeoverIsGivenBack(t *testing.T) {
	ctx := context.Background()
	aDrv, bDrv := mem.New(), mem.New()
	wire := &wireDriver{Driver: aDrv}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "a", aDrv), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", wire)},
		{Name: "b", Domain: "d2", Bucket: substratetest.NewBucket(t, "b", bDrv)}},
		Authority: "a", Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
	eA, eB := open(t, optsA), open(t, optsB)
	sh := openShard(t, eA, "x")
	if _, err := sh.Append(ctx, []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	if err := sh.Close(ctx); err != nil {
		t.Fatal(err)
	}

	wire.arm(`^shards/x/manifest$`)
	_, err := eB.BackfillIdle(ctx, "x")
	if !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Errorf("B's backfill of x, its takeover's write still on the wire: %v; want ErrUnknownOutcome", err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := wire.land(t); err != nil {
		t.Fatalf("the late takeover write: %v", err)
	}
	openWithin(t, eA, "x", 5*lateLease.Duration, "B's backfill takeover landed late")
}

// B's takeover of x is still on the wire when B's orphan pass first looks at x: no
// manifest yet, as though nothing were taken. The pass must not settle the orphan
// on that: the write can still land. It settles it by taking x (which moves the
// manifest past the version the write was sent for) and giving it back; the late
// write then fails, and A opens x.
func TestATakeoverWriteStillInFlightIsSettledByTheOrphanPass(t *testing.T) {
	ctx := context.Background()
	optsA, optsB, wire := lateMachines(t)
	eA, eB := open(t, optsA), open(t, optsB)
	wire.arm(`^shards/x/manifest$`)
	_, err := eB.OpenShard(ctx, "x")
	if !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("B's open of x, its takeover's write still on the wire: %v; want ErrUnknownOutcome", err)
	}
	// Three renewals of B, and their passes, with the write still on the wire.
	st := ownership.NewStore(optsA.Bucket)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if m, _, err := st.Load(ctx, "x"); err == nil && m.Owner == eB.Instance() && m.Released {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	err = wire.land(t)
	t.Logf("the late takeover write: %v", err)
	openWithin(t, eA, "x", 5*lateLease.Duration, "B's takeover write landed after B's orphan passes")
}
