package ownership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/manifest"
)

// After the instance lease lapsed, its renewal does not bring the shard's
// ownership back by itself: a takeover may have read the lease ended in between.
// A write of the manifest confirms it.
func TestAnOwnershipIsConfirmedAfterALapseBeforeItAcknowledges(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	st := NewStore(bucket(t, "a", nil))
	opts := halfMinute(c)
	h := instance(t, st, "A", opts)
	o, _, err := Acquire(ctx, st, "s", h, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Valid(); err != nil || o.Lapsed() {
		t.Fatalf("after the takeover: %v, lapsed %v", err, o.Lapsed())
	}
	c.Advance(29 * time.Second)
	if err := o.Valid(); !errors.Is(err, manifest.ErrLeaseExpired) {
		t.Fatalf("after the instance lease ran out: %v, want ErrLeaseExpired", err)
	}
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := o.Valid(); !errors.Is(err, manifest.ErrLeaseExpired) || !o.Lapsed() {
		t.Fatalf("after a renewal that came too late, unconfirmed: %v, lapsed %v; want ErrLeaseExpired", err, o.Lapsed())
	}
	if err := o.Confirm(ctx); err != nil {
		t.Fatal(err)
	}
	if err := o.Valid(); err != nil || o.Lapsed() {
		t.Fatalf("after the confirmation: %v, lapsed %v", err, o.Lapsed())
	}
}

// A takeover that found the owner's instance lease ended races the owner's
// renewal and confirmation; whichever publishes the manifest first wins, and the
// other side learns it.
func TestATakeoverThatFoundTheLeaseEndedRacesTheOwnersConfirmation(t *testing.T) {
	ctx := context.Background()
	for _, first := range []string{"confirmation", "takeover"} {
		t.Run(first+" first", func(t *testing.T) {
			c := testclock.New()
			st := NewStore(bucket(t, "a", nil))
			opts := halfMinute(c)
			ha := instance(t, st, "A", opts)
			a, _, err := Acquire(ctx, st, "s", ha, opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.Advance(33 * time.Second) // A's lease ended, by more than the skew margin
			hb := instance(t, st, "B", opts)
			claim, err := Inspect(ctx, st, "s", "B", opts)
			if err != nil || !claim.Expired {
				t.Fatalf("B's inspection: %+v, %v; want an expired claim", claim, err)
			}
			if err := ha.Renew(ctx); err != nil { // the renewal lands after B's read
				t.Fatal(err)
			}
			if first == "confirmation" {
				if err := a.Confirm(ctx); err != nil {
					t.Fatal(err)
				}
				if err := a.Valid(); err != nil {
					t.Fatalf("A after confirming: %v", err)
				}
				if _, err := Take(ctx, st, claim, hb, opts, nil); !errors.Is(err, manifest.ErrMoved) {
					t.Fatalf("B's takeover after A confirmed: %v, want ErrMoved", err)
				}
				if _, err := Inspect(ctx, st, "s", "B", opts); !errors.Is(err, manifest.ErrOwned) {
					t.Fatalf("B's inspection again: %v, want ErrOwned", err)
				}
				return
			}
			b, err := Take(ctx, st, claim, hb, opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Valid(); err == nil {
				t.Fatalf("A acknowledges after its renewal while B owns epoch %d", b.Epoch())
			}
			if err := a.Confirm(ctx); !errors.Is(err, manifest.ErrFenced) {
				t.Fatalf("A's confirmation after B took over: %v, want ErrFenced", err)
			}
		})
	}
}

// The shards an instance owned under one acquisition of its lease are anyone's
// once it acquired the lease again (it restarted, and did not open them).
func TestAShardOfARestartedInstanceIsTakenOverAtOnce(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	st := NewStore(bucket(t, "a", nil))
	opts := halfMinute(c)
	if _, _, err := Acquire(ctx, st, "s", instance(t, st, "A", opts), opts, nil); err != nil {
		t.Fatal(err)
	}
	instance(t, st, "A", opts) // the restart
	claim, err := Inspect(ctx, st, "s", "B", opts)
	if err != nil || !claim.Expired {
		t.Fatalf("B's inspection of a shard the restarted A did not open: %+v, %v; want an expired claim", claim, err)
	}
}

// A manifest written before instance leases carries the shard's own lease; it is
// honored until its expiry and the skew margin.
func TestALegacyShardLeaseIsHonoredUntilItsExpiry(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	st := NewStore(bucket(t, "a", nil))
	m := manifest.Manifest{Shard: "s", Epoch: 4, Seq: 9, Owner: "old", LeaseExpiry: c.Now().Add(30 * time.Second)}
	if _, _, err := st.publish(ctx, m, ""); err != nil {
		t.Fatal(err)
	}
	opts := halfMinute(c)
	if _, err := Inspect(ctx, st, "s", "B", opts); !errors.Is(err, manifest.ErrOwned) {
		t.Fatalf("B before the legacy lease's expiry: %v, want ErrOwned", err)
	}
	c.Advance(31 * time.Second)
	if _, err := Inspect(ctx, st, "s", "B", opts); !errors.Is(err, manifest.ErrOwned) {
		t.Fatalf("B within the skew margin after it: %v, want ErrOwned", err)
	}
	c.Advance(2 * time.Second)
	b, _, err := Acquire(ctx, st, "s", instance(t, st, "B", opts), opts, nil)
	if err != nil || b.Epoch() != 5 {
		t.Fatalf("B after the legacy lease ended: %v", err)
	}
	if got := b.Manifest(); got.Lease == "" || !got.LeaseExpiry.IsZero() {
		t.Fatalf("B's manifest: lease %q, expiry %s; want its instance lease and no expiry", got.Lease, got.LeaseExpiry)
	}
}
