package ownership

import (
	"context"
	"errors"
	"testing"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate/mem"
)

// A takeover's write is sent and stays on the wire; its client gives up at once,
// and reading the authority back finds nothing there. The write can still land,
// on the version the takeover read, and names the instance lease for a shard its
// caller holds no Owner of: Take must say its outcome is unknown, not that it
// failed, so that the caller keeps the shard to give back.
func TestATakeWhoseReadBackFindsNothingIsOfUnknownOutcome(t *testing.T) {
	ctx := context.Background()
	d := &slowDriver{Driver: mem.New(), giveUp: errors.New("the client gave up waiting")}
	st := NewStore(bucket(t, "a", d))
	t.Cleanup(st.Close)
	held := instance(t, st, "A", LeaseOptions{})
	c, err := Inspect(ctx, st, "s", "A", LeaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Version() != "" {
		t.Fatalf("a new shard's claim has version %q, want none", c.Version())
	}
	d.arm(`^shards/s/manifest$`)
	_, err = Take(ctx, st, c, held, LeaseOptions{}, nil)
	if err == nil {
		t.Fatal("a takeover whose write is still on the wire succeeded")
	}
	if !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("a takeover whose read-back found nothing, its write still on the wire: %v; want ErrUnknownOutcome", err)
	}

	d.land(t)
	m, _, err := st.Load(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if m.Owner != "A" || m.Lease != held.Token() || m.Released || m.Epoch != c.Epoch() {
		t.Fatalf("after the late write: owner %q lease %q released %v epoch %d; want A's, epoch %d", m.Owner, m.Lease, m.Released, m.Epoch, c.Epoch())
	}
}
