package lease

import (
	"context"
	"testing"

	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/substrate/substratetest"
)

// A process that restarts (Continue) and dies again before it lets the carried
// tokens go, again and again (a crash loop), carries the newest tokens only: the
// record stays bounded.
func TestACrashLoopCarriesABoundedChain(t *testing.T) {
	ctx := context.Background()
	c := testclock.New()
	b := substratetest.NewBucket(t, "a", nil)
	var h *Held
	var err error
	for range 200 {
		if h, err = Continue(ctx, b, "k", "A", nil, withClock(c)); err != nil {
			t.Fatal(err)
		}
	}
	r, _, _ := Read(ctx, b, "k")
	if len(r.Carried) > maxCarried {
		t.Fatalf("after 200 restarts that never let go, the lease record carries %d tokens (%d bytes of tokens); Uncarry: %v", len(r.Carried), 17*len(r.Carried), h.Carries())
	}
}
