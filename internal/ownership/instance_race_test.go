package ownership

import (
	"bytes"
	"context"
	"errors"
	"io"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// slowDriver holds one armed conditional write "on the wire": the caller's
// context ends and the caller sees the error, while the write itself lands later,
// when the test says so (a request already sent that the store applies late).
type slowDriver struct {
	substrate.Driver
	mu      sync.Mutex
	key     *regexp.Regexp
	arrived chan struct{}
	pending func() error
	// giveUp, if set, is what the caller sees at once (its client timed out),
	// instead of waiting for its context to end.
	giveUp error
}

func (d *slowDriver) arm(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.key = regexp.MustCompile(key)
	d.arrived = make(chan struct{})
}

func (d *slowDriver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	d.mu.Lock()
	if d.key == nil || !d.key.MatchString(key) || (!cond.IfAbsent && cond.IfMatch == "") {
		d.mu.Unlock()
		return d.Driver.Put(ctx, key, body, cond)
	}
	data, err := io.ReadAll(body)
	if err != nil {
		d.mu.Unlock()
		return substrate.Attrs{}, err
	}
	d.key = nil
	d.pending = func() error {
		_, err := d.Driver.Put(context.Background(), key, bytes.NewReader(data), cond)
		return err
	}
	close(d.arrived)
	giveUp := d.giveUp
	d.mu.Unlock()
	if giveUp != nil {
		return substrate.Attrs{}, giveUp
	}
	<-ctx.Done()
	return substrate.Attrs{}, ctx.Err()
}

// land applies the write held on the wire.
func (d *slowDriver) land(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	p := d.pending
	d.pending = nil
	d.mu.Unlock()
	if p == nil {
		t.Fatal("no write on the wire")
	}
	if err := p(); err != nil {
		t.Fatalf("the late write: %v", err)
	}
}

// A takeover whose publish failed and whose read-back found the manifest it meant
// to write confirms nothing: those bytes may be an earlier attempt's, begun in an
// earlier generation of the instance lease, that a takeover by another instance
// has read since, judging the lease ended (DESIGN.md §7: "A write of the same
// bytes found by reading back ... confirms nothing, since it may be an earlier
// attempt's").
//
//  1. A's first takeover of s is sent (in lease generation 1) and stays on the
//     wire; A's context ends and the takeover fails.
//  2. A inspects s again (the engine's retry): still unowned, the same claim.
//  3. The first takeover lands: s is A's at epoch 1 under A's token.
//  4. A's lease runs out unrenewed; B inspects s and finds A's lease ended.
//  5. A's renewal lands late: generation 2.
//  6. A's second takeover (same claim, so the same bytes) fails before it reaches
//     the store; the read-back finds its bytes (the first takeover's) and calls it
//     landed, and the owner is confirmed in generation 2.
//  7. B's takeover publishes on the version it read: B owns epoch 2.
//
// A and B both acknowledge.
func TestATakeWhoseReadBackFindsAnEarlierAttemptsBytesConfirmsNothing(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	fd := fault.Wrap(mem.New(), 1)
	sd := &slowDriver{Driver: fd}
	st := NewStore(bucket(t, "a", sd))
	opts := halfMinute(c)
	ha := instance(t, st, "A", opts)

	first, err := Inspect(ctx, st, "s", "A", opts)
	if err != nil {
		t.Fatal(err)
	}
	sd.arm(`^shards/s/manifest$`)
	tctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := Take(tctx, st, first, ha, opts, nil)
		done <- err
	}()
	<-sd.arrived
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the takeover whose context ended succeeded")
	}

	again, err := Inspect(ctx, st, "s", "A", opts) // the retry's inspection
	if err != nil {
		t.Fatal(err)
	}
	sd.land(t) // the first takeover lands now

	c.Advance(33 * time.Second) // A's lease ran out by more than the skew margin
	hb := instance(t, st, "B", opts)
	claim, err := Inspect(ctx, st, "s", "B", opts)
	if err != nil || !claim.Expired {
		t.Fatalf("B's inspection: %+v, %v; want an expired claim", claim, err)
	}
	if err := ha.Renew(ctx); err != nil { // late: a new generation
		t.Fatal(err)
	}

	// The second takeover's write fails before it reaches the store.
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: `^shards/s/manifest$`, Nth: 1, Err: fault.ErrInjected})
	a, err := Take(ctx, st, again, ha, opts, nil)
	fd.SetRules()
	if err != nil {
		t.Logf("A's second takeover: %v", err)
		return // refusing is safe
	}
	b, err := Take(ctx, st, claim, hb, opts, nil)
	if err != nil {
		t.Logf("B's takeover: %v", err)
		return
	}
	if aerr, berr := a.Valid(), b.Valid(); aerr == nil && berr == nil {
		t.Fatalf("A (epoch %d) and B (epoch %d) both acknowledge for shard s at %s: A's takeover was confirmed by an earlier attempt's bytes, which B's inspection had read",
			a.Epoch(), b.Epoch(), c.Now().Format(time.RFC3339))
	}
}

// An instance lease object that is gone (deleted by an operator or a bucket
// lifecycle rule) does not show its holder gone: the holder still acknowledges
// until its next renewal finds the object missing. A takeover must not take the
// missing object for an ended lease at once.
func TestAMissingInstanceLeaseDoesNotFreeItsShardsWhileItsHolderIsValid(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	st := NewStore(bucket(t, "a", nil))
	opts := halfMinute(c)
	ha := instance(t, st, "A", opts)
	a, _, err := Acquire(ctx, st, "s", ha, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Authority().Delete(ctx, lease.InstanceKey("A")); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Second)
	hb := instance(t, st, "B", opts)
	claim, err := Inspect(ctx, st, "s", "B", opts)
	if err == nil {
		b, err := Take(ctx, st, claim, hb, opts, nil)
		if err == nil && a.Valid() == nil && b.Valid() == nil {
			t.Fatalf("A (epoch %d) and B (epoch %d, claim expired=%v) both acknowledge for shard s one second after A's lease object went missing",
				a.Epoch(), b.Epoch(), claim.Expired)
		}
		t.Fatalf("B's takeover one second after A's lease object went missing: %v, want ErrOwned", err)
	}
	if !errors.Is(err, manifest.ErrOwned) {
		t.Fatalf("B's inspection: %v, want ErrOwned", err)
	}
	// A's next renewal writes its lease anew, and A stays valid.
	c.Advance(9 * time.Second)
	if err := ha.Renew(ctx); err != nil {
		t.Fatalf("A's renewal after its lease object went missing: %v", err)
	}
	if err := a.Valid(); err != nil {
		t.Fatalf("A after renewing: %v", err)
	}
	// A stops: the shard is B's a lease and the skew margin after that renewal.
	c.Advance(33 * time.Second)
	if _, _, err := Acquire(ctx, st, "s", hb, opts, nil); err != nil {
		t.Fatalf("B once A's renewed lease ran out: %v", err)
	}
}

// A takeover whose write failed and whose read-back failed too may have landed:
// the caller is told so by ErrUnknownOutcome, as an owner's write in the same case
// is (guarantee: lost replies give clear typed errors).
func TestATakeWhoseOutcomeIsUnknownSaysSo(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	fd := fault.Wrap(mem.New(), 1)
	st := NewStore(bucket(t, "a", fd))
	opts := halfMinute(c)
	h := instance(t, st, "A", opts)
	claim, err := Inspect(ctx, st, "s", "A", opts)
	if err != nil {
		t.Fatal(err)
	}
	fd.SetRules(
		fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: `^shards/s/manifest$`, Nth: 1, Ambiguous: true, Err: fault.ErrInjected},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Key: `^shards/s/manifest$`, Nth: 1, Err: fault.ErrInjected})
	_, err = Take(ctx, st, claim, h, opts, nil)
	if err == nil {
		t.Fatal("the takeover succeeded though its outcome could not be read back")
	}
	if !errors.Is(err, manifest.ErrUnknownOutcome) {
		t.Fatalf("a takeover that landed with its reply and its read-back lost: %v; want ErrUnknownOutcome", err)
	}
}
