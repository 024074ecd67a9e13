package fleet

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/l0store/l0/substrate/mem"
)

// One lease object under instances/ that does not decode — not a member's, not
// even an engine's — makes lease.ListAll fail, so readMembers fails and the
// leader never publishes: the whole fleet stops placing shards.
func TestACorruptInstanceLeaseStopsNoPublish(t *testing.T) {
	drv := mem.New()
	shards := shardsN(4)
	a := joinMem(t, drv, shards, Options{})
	if _, err := a.e.Authority().PutBytes(t.Context(), "instances/junk/lease", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return openOn(shards, a) }) {
		_, err := readMembers(t.Context(), a.e.Authority(), "default", a.m.leaseOpts)
		t.Fatalf("5 s after joining, the only member owns %v of %d shards, %d publishes, %d failed steps: one corrupt instance lease stops every publish (readMembers: %v)",
			a.m.Owned(), len(shards), a.m.Stats().Publishes, a.m.Stats().Failures, err)
	}
}

// A corrupt assignment object gives a typed error, but the leader's lead() fails
// on it before it publishes, so nobody ever writes over it: no member joining or
// leaving is ever placed again.
func TestACorruptAssignmentIsWrittenOver(t *testing.T) {
	drv := mem.New()
	shards := shardsN(8)
	a := joinMem(t, drv, shards, Options{})
	if !eventually(5*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	if _, err := a.e.Authority().PutBytes(t.Context(), assignmentKey("default"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readAssignment(t.Context(), a.e.Authority(), "default"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("reading a corrupt assignment: %v, want ErrCorrupt", err)
	}
	b := joinMem(t, drv, shards, Options{})
	if !eventually(5*time.Second, func() bool { return len(b.m.Owned()) >= 3 }) {
		_, _, err := readAssignment(t.Context(), a.e.Authority(), "default")
		t.Fatalf("5 s after b joined, b owns %v and a %v; the assignment still reads %v: the leader never writes over a corrupt assignment",
			b.m.Owned(), a.m.Owned(), err)
	}
}

// Join takes a NaN or infinite weight, which it publishes in the member's lease;
// the planner's shares then are NaN, every comparison is false, and every shard
// goes to the first member in id order, whatever the others' weights.
func TestJoinRefusesANonFiniteWeight(t *testing.T) {
	for _, w := range []float64{math.NaN(), math.Inf(1)} {
		opts := Options{Weight: w, Shards: noShards}
		opts.ensureDefaults()
		if err := opts.validate(); err == nil {
			t.Errorf("Join's validation takes Weight %v", w)
		}
	}
}

func TestPlanOverAMemberOfNonFiniteWeightStillBalances(t *testing.T) {
	shards := make([]Shard, 30)
	for i := range shards {
		shards[i] = Shard{ID: fmt.Sprintf("s%02d", i)}
	}
	for _, w := range []float64{math.NaN(), math.Inf(1)} {
		// a's lease says weight NaN (or +Inf): a corrupt attribute, or a Join that
		// took it.
		members := []Member{{ID: "a", Weight: w}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1}}
		got := Plan(members, shards, nil, nil)
		count := map[string]int{}
		for _, m := range got {
			count[m]++
		}
		if count["b"] == 0 || count["c"] == 0 {
			t.Errorf("weight %v for a: the plan places %v (a, b, c); b and c, of weight 1, get nothing", w, count)
		}
	}
}

// The assignment object deleted (an operator, a lifecycle rule) reads as the
// empty assignment: every member closes every shard it has open, as if the
// catalog had dropped them all, until the leader publishes again and each is
// opened anew.
func TestADeletedAssignmentClosesNoShard(t *testing.T) {
	drv := mem.New()
	shards := shardsN(8)
	a := joinMem(t, drv, shards, Options{PublishEvery: 500 * time.Millisecond})
	if !eventually(5*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	opens := a.m.Stats().Opens
	if err := a.e.Authority().Delete(t.Context(), assignmentKey("default")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if !eventually(5*time.Second, func() bool { return openOn(shards, a) }) {
		t.Fatalf("a owns %v", a.m.Owned())
	}
	if got := a.m.Stats().Opens - opens; got != 0 {
		t.Errorf("after the assignment object was deleted, the only member closed and reopened %d of its %d shards", got, len(shards))
	}
}
