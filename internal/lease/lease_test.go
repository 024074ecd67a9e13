package lease

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var opts = Options{Duration: 30 * time.Second, SkewMargin: 2 * time.Second}

func withClock(c *testclock.Clock) Options {
	o := opts
	o.Clock = c
	return o
}

func TestALeaseIsTakenOnlySkewAfterItsExpiryOrAtOnceAfterRelease(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	b := substratetest.NewBucket(t, "a", nil)
	a, err := Acquire(ctx, b, "k", "A", map[string]string{"weight": "2"}, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	var held *HeldError
	if _, err := Acquire(ctx, b, "k", "B", nil, withClock(c)); !errors.As(err, &held) || held.Holder != "A" {
		t.Fatalf("B while A holds: %v, want a HeldError naming A", err)
	}
	c.Advance(29 * time.Second) // past A's validity (30 s - 2 s), within the skew margin after its expiry
	if _, err := a.Valid(); !errors.Is(err, ErrExpired) {
		t.Fatalf("A after 29 s unrenewed: %v, want ErrExpired", err)
	}
	if _, err := Acquire(ctx, b, "k", "B", nil, withClock(c)); !errors.Is(err, ErrHeld) {
		t.Fatalf("B 1 s before the expiry: %v, want ErrHeld", err)
	}
	c.Advance(2 * time.Second) // past the expiry, within the skew margin after it
	if _, err := Acquire(ctx, b, "k", "B", nil, withClock(c)); !errors.Is(err, ErrHeld) {
		t.Fatalf("B 1 s after the expiry, within the skew margin: %v, want ErrHeld", err)
	}
	c.Advance(1500 * time.Millisecond) // past expiry + skew margin
	bh, err := Acquire(ctx, b, "k", "B", nil, withClock(c))
	if err != nil {
		t.Fatalf("B after the expiry and the skew margin: %v", err)
	}
	if err := a.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("A's renewal after B took the lease: %v, want ErrLost", err)
	}
	if _, err := a.Valid(); !errors.Is(err, ErrLost) {
		t.Fatalf("A after losing the lease: %v, want ErrLost for good", err)
	}
	if err := bh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := bh.Valid(); !errors.Is(err, ErrReleased) {
		t.Fatalf("B after Release: %v", err)
	}
	r, _, err := Read(ctx, b, "k")
	if err != nil || !r.Released || r.Live(c.Now(), opts.SkewMargin) {
		t.Fatalf("the record after Release: %+v, %v", r, err)
	}
	if _, err := Acquire(ctx, b, "k", "C", nil, withClock(c)); err != nil {
		t.Fatalf("C right after B's release: %v", err)
	}
}

func TestAHolderRetakesItsOwnLeaseAtOnceUnderANewToken(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	b := substratetest.NewBucket(t, "a", nil)
	first, err := Acquire(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatalf("A again (a restart): %v", err)
	}
	if again.Token() == first.Token() {
		t.Fatal("a second acquisition kept the first one's token")
	}
	if err := first.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("the earlier acquisition's renewal: %v, want ErrLost", err)
	}
}

// gate is a driver whose conditional writes block while it is shut.
type gate struct {
	substrate.Driver
	mu     sync.Mutex
	shut   chan struct{}
	queued chan struct{}
}

func (g *gate) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut != nil {
		g.queued <- struct{}{}
		<-shut
	}
	return g.Driver.Put(ctx, key, body, cond)
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut, g.queued = make(chan struct{}), make(chan struct{}, 1)
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.shut)
	g.shut = nil
}

// A renewal that began while the lease was valid but landed after its validity ran
// out must not carry the validity over: a reader may have found the lease ended in
// between, and taken over what the holder derived from it. It starts a new
// generation; one that lands in time keeps the generation.
func TestARenewalThatLandsAfterTheValidityRanOutStartsANewGeneration(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	g := &gate{Driver: mem.New()}
	b := substratetest.NewBucket(t, "a", g)
	h, err := Acquire(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	gen0, _ := h.Valid()
	c.Advance(10 * time.Second)
	if err := h.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if gen, err := h.Valid(); err != nil || gen != gen0 {
		t.Fatalf("after a renewal in time: generation %d, %v; want %d, valid", gen, err, gen0)
	}
	// A renewal begins at t0+20s, valid until t0+38s; it stays in flight until
	// t0+39s.
	c.Advance(10 * time.Second)
	g.close()
	done := make(chan error, 1)
	go func() { done <- h.Renew(ctx) }()
	<-g.queued
	c.Skip(19 * time.Second)
	if _, err := h.Valid(); !errors.Is(err, ErrExpired) {
		t.Fatalf("while the renewal is in flight past the validity: %v, want ErrExpired", err)
	}
	g.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	gen, err := h.Valid()
	if err != nil {
		t.Fatalf("after the late renewal: %v, want valid (from when it began)", err)
	}
	if gen == gen0 {
		t.Fatalf("a renewal that landed after the validity ran out kept generation %d", gen)
	}
}

// A renewal whose reply was lost has landed when the object holds its bytes.
func TestARenewalWhoseReplyWasLostIsFoundLanded(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	fd := fault.Wrap(mem.New(), 1)
	b := substratetest.NewBucket(t, "a", fd)
	h, err := Acquire(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	gen0, _ := h.Valid()
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: errors.New("reply lost")})
	c.Advance(10 * time.Second)
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("a renewal that landed with its reply lost: %v", err)
	}
	c.Advance(25 * time.Second) // valid only by that renewal
	if gen, err := h.Valid(); err != nil || gen != gen0 {
		t.Fatalf("generation %d, %v", gen, err)
	}
	// Another write of ours lands late, after a later one: the next renewal
	// writes over it rather than taking the lease for lost.
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: errors.New("reply lost")},
		fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Nth: 1, Err: errors.New("read back lost")})
	if err := h.Renew(ctx); err == nil {
		t.Fatal("a renewal whose reply and read back were lost reported success")
	}
	fd.SetRules()
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("the renewal after one of unknown outcome: %v", err)
	}
}

func TestACorruptLeaseIsReportedAsSuch(t *testing.T) {
	ctx := context.Background()
	b := substratetest.NewBucket(t, "a", nil)
	if _, err := b.PutBytes(ctx, "k", []byte(`{"holder":"A"`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Read(ctx, b, "k"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read: %v, want ErrCorrupt", err)
	}
	if _, err := Acquire(ctx, b, "k", "B", nil, opts); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("acquire: %v, want ErrCorrupt", err)
	}
	if _, err := Acquire(ctx, b, "bad key//", "B", nil, opts); !errors.Is(err, substrate.ErrInvalidKey) {
		t.Fatalf("acquire of an invalid key: %v, want ErrInvalidKey", err)
	}
	if _, err := Acquire(ctx, b, "k2", "B", nil, Options{Duration: time.Second, SkewMargin: time.Second}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("acquire with a skew margin of the whole lease: %v, want ErrInvalidOptions", err)
	}
}

func TestConcurrentAcquiresHaveOneWinner(t *testing.T) {
	ctx := context.Background()
	b := substratetest.NewBucket(t, "a", nil)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins []string
	)
	for _, holder := range []string{"A", "B", "C", "D", "E", "F"} {
		wg.Go(func() {
			_, err := Acquire(ctx, b, "k", holder, nil, opts)
			if err == nil {
				mu.Lock()
				wins = append(wins, holder)
				mu.Unlock()
			} else if !errors.Is(err, ErrHeld) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d holders won: %v", len(wins), wins)
	}
}

// A lease object deleted under its holder (an operator, a lifecycle rule) is
// written anew by the holder's next renewal, under the same token.
func TestARenewalWritesADeletedLeaseAnew(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	b := substratetest.NewBucket(t, "a", nil)
	h, err := Acquire(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	c.Advance(10 * time.Second)
	if err := h.Renew(ctx); err != nil {
		t.Fatalf("the renewal of a deleted lease: %v", err)
	}
	r, _, err := Read(ctx, b, "k")
	if err != nil || r.Token != h.Token() || !r.Live(c.Now(), opts.SkewMargin) {
		t.Fatalf("the lease after the renewal: %+v, %v", r, err)
	}
}

// Continue takes the lease under a new token that carries the earlier, unreleased
// acquisition's: the record holds what was derived from either, the earlier holder
// loses the lease at its next renewal, a stand-in a reader writes back under the
// carried token (the object deleted) is the holder's own, and once the holder lets
// the carried token go the record holds only its own. After a release nothing is
// carried.
func TestContinueCarriesTheEarlierTokenUntilItIsLetGo(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	b := substratetest.NewBucket(t, "a", nil)
	first, err := Acquire(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	next, err := Continue(ctx, b, "k", "A", nil, withClock(c))
	if err != nil {
		t.Fatalf("Continue: %v", err)
	}
	if next.Token() == first.Token() {
		t.Fatal("Continue kept the earlier token as its own")
	}
	r, _, err := Read(ctx, b, "k")
	if err != nil || !r.Holds(first.Token()) || !r.Holds(next.Token()) || !next.Holds(first.Token()) || !next.Carries() {
		t.Fatalf("after Continue the record %+v (%v) does not hold both tokens", r, err)
	}
	if err := first.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("the earlier acquisition's renewal: %v, want ErrLost", err)
	}
	if err := b.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := Reinstate(ctx, b, "k", Record{Holder: "A", Token: first.Token()}, withClock(c)); err != nil {
		t.Fatal(err)
	}
	if err := next.Renew(ctx); err != nil {
		t.Fatalf("a renewal over a stand-in under the carried token: %v", err)
	}
	if err := next.Uncarry(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _, err = Read(ctx, b, "k"); err != nil || r.Holds(first.Token()) || !r.Holds(next.Token()) || next.Carries() {
		t.Fatalf("after Uncarry the record %+v (%v) still holds the earlier token", r, err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last, err := Continue(ctx, b, "k", "A", nil, withClock(c))
	if err != nil || last.Carries() {
		t.Fatalf("Continue after a release carries %v (%v)", last.Carries(), err)
	}
}

func TestARevokedLeaseIsReleasedAndItsHolderLosesIt(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	b := substratetest.NewBucket(t, "a", nil)
	a, err := Acquire(ctx, b, "k", "A", map[string]string{"weight": "2"}, withClock(c))
	if err != nil {
		t.Fatal(err)
	}
	_, ver, err := Read(ctx, b, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := Revoke(ctx, b, "k", ver); !errors.Is(err, ErrChanged) {
		t.Fatalf("a revoke of the record before a renewal: %v, want ErrChanged", err)
	}
	cur, ver, err := Read(ctx, b, "k")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := Revoke(ctx, b, "k", ver)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := Read(ctx, b, "k")
	switch {
	case err != nil:
		t.Fatal(err)
	case !r.Released || r.Live(c.Now(), opts.SkewMargin) || r.Holder != "A" || r.Attrs["weight"] != "2":
		t.Fatalf("the revoked record: %+v, want A's, released, its attributes kept", r)
	case r.Holds(cur.Token) || r.Token != rec.Token:
		t.Fatalf("the revoked record %+v holds the token %s its holder's shards name", r, cur.Token)
	}
	if err := a.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("the holder's renewal after the revoke: %v, want ErrLost", err)
	}
	if _, err := Acquire(ctx, b, "k", "B", nil, withClock(c)); err != nil {
		t.Fatalf("B right after the revoke: %v", err)
	}
}
