package engine

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// stallRead makes the next read of an armed key hang until its caller gives up.
type stallRead struct {
	substrate.Driver
	mu      sync.Mutex
	key     *regexp.Regexp
	stalled chan struct{}
}

func (d *stallRead) arm(key string) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = regexp.MustCompile(key)
	d.stalled = make(chan struct{})
	return d.stalled
}

func (d *stallRead) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	d.mu.Lock()
	if d.key != nil && d.key.MatchString(key) {
		d.key = nil
		close(d.stalled)
		d.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	d.mu.Unlock()
	return d.Driver.NewRangeReader(ctx, key, off, length)
}

// B's takeover of x stays on the wire: ErrUnknownOutcome, kept as an orphan whose
// write may still land (no manifest yet). A user's OpenShard(x) on B is in flight
// (its read of the manifest slow) when B's orphan pass looks at x, and then fails.
// The pass's own open meets ErrShardOpen, which must not settle the orphan: that
// open may fail without moving the manifest. The late write lands afterwards; the
// orphan pass must still give x back, so that A can open it.
func TestAnOpenInFlightDoesNotSettleAnOrphan(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	stall := &stallRead{Driver: drv}
	wire := &wireDriver{Driver: stall}
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", wire), Seal: quietSealOptions(), Lease: lateLease, RenewEvery: time.Second}
	eA, eB := open(t, optsA), open(t, optsB)

	wire.arm(`^shards/x/manifest$`)
	if _, err := eB.OpenShard(ctx, "x"); !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("B's open of x, its takeover's write on the wire: %v; want ErrUnknownOutcome", err)
	}
	stalled := stall.arm(`^shards/x/manifest$`)
	uctx, cancel := context.WithTimeout(ctx, 3500*time.Millisecond) // spans B's next renewals and their passes
	defer cancel()
	done := make(chan error)
	go func() {
		_, err := eB.OpenShard(uctx, "x")
		done <- err
	}()
	<-stalled
	err := <-done
	t.Logf("the user's open of x on B, in flight across B's orphan passes: %v", err)
	if err == nil {
		t.Fatal("the user's open of x succeeded, though its manifest read was held until its caller gave up")
	}
	if err := wire.land(t); err != nil {
		t.Fatalf("the late takeover write: %v", err)
	}
	st := ownership.NewStore(optsA.Bucket)
	m, _, _ := st.Load(ctx, "x")
	t.Logf("x's manifest after the late write: owner %s (B is %s) released=%v", m.Owner, eB.Instance(), m.Released)
	openWithin(t, eA, "x", 5*lateLease.Duration, "B's takeover landed late, after B's user open (in flight during the orphan pass) failed")
}
