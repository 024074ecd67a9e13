package engine

import (
	"context"
	"io"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// stallPut is a driver whose next write of a key it is armed with hangs until
// the test lets it go, as a request stuck on a connection does; every other call
// goes through at once.
type stallPut struct {
	substrate.Driver
	mu      sync.Mutex
	key     *regexp.Regexp
	stalled chan struct{}
	release chan struct{}
}

func (d *stallPut) arm(key string) (stalled, release chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = regexp.MustCompile(key)
	d.stalled, d.release = make(chan struct{}), make(chan struct{})
	return d.stalled, d.release
}

func (d *stallPut) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	d.mu.Lock()
	if d.key != nil && d.key.MatchString(key) {
		d.key = nil
		stalled, release := d.stalled, d.release
		d.mu.Unlock()
		close(stalled)
		select {
		case <-release:
		case <-ctx.Done():
			return substrate.Attrs{}, ctx.Err()
		}
		return d.Driver.Put(ctx, key, body, cond)
	}
	d.mu.Unlock()
	return d.Driver.Put(ctx, key, body, cond)
}

// TestAStuckSetAttributesDoesNotStopTheRenewals: an engine keeps its shards while
// the object store answers its renewals; the instance lease is renewed every
// RenewEvery, each attempt bounded by it, so that one request that never returns
// costs one attempt. A fleet member publishes its attributes through
// SetAttributes, on its loop's context, which has no deadline.
//
// The interleaving: shard x is open and idle. SetAttributes writes the lease, and
// that one write hangs (a stuck connection); the store answers every other call.
// Expected: the renewals go on around it, and x takes appends a lease's duration
// later. Found: SetAttributes holds the lease's lock across its write, bounded
// only by the caller's context; every renewal waits for the lock, the lease lapses
// by the engine's own clock, and x refuses appends (its lease expired) for as
// long as the write hangs; past the lease and the skew margin another machine
// may take x over.
func TestAStuckSetAttributesDoesNotStopTheRenewals(t *testing.T) {
	ctx := context.Background()
	stall := &stallPut{Driver: mem.New()}
	e := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", stall), Seal: quietSealOptions(),
		Lease: lateLease, RenewEvery: 500 * time.Millisecond})
	x := openShard(t, e, "x")
	if _, err := x.Append(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	stalled, release := stall.arm(`^instances/.*/lease$`)
	done := make(chan error, 1)
	go func() { done <- e.SetAttributes(context.Background(), map[string]string{"role": "server"}) }()
	defer func() {
		close(release)
		<-done
	}()
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("SetAttributes never wrote the lease")
	}
	time.Sleep(lateLease.Duration)
	if _, err := x.Append(ctx, []byte("after")); err != nil {
		t.Fatalf("an append %s into a stuck SetAttributes, the store answering the renewals: %v", lateLease.Duration, err)
	}
}
