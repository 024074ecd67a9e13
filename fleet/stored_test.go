package fleet

import (
	"errors"
	"slices"
	"testing"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestReadStoredReadsAFleetAsItsObjectsHoldIt(t *testing.T) {
	ctx := t.Context()
	b := substratetest.NewBucket(t, "authority", nil)
	opts := lease.Options{}
	for _, m := range []struct {
		id    string
		attrs map[string]string
	}{
		{"m1", map[string]string{attrFleet: "f", attrWeight: "2", attrShards: "a,b"}},
		{"m2", map[string]string{attrFleet: "f", attrWeight: "1", attrLeaving: "1"}},
		{"other", map[string]string{attrFleet: "g"}},
		{"lone", nil},
	} {
		if _, err := lease.Acquire(ctx, b, lease.InstanceKey(m.id), m.id, m.attrs, opts); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lease.Acquire(ctx, b, leaderKey("f"), "m1", nil, opts); err != nil {
		t.Fatal(err)
	}
	p := published{Seq: 3, Leader: "m1", Members: []string{"m1"}, Shards: Assignment{"a": "m1", "b": "m1", "c": "m2"}}
	if ok, err := writeAssignment(ctx, b, "f", p, ""); !ok || err != nil {
		t.Fatalf("write the assignment: %v, %v", ok, err)
	}

	st, err := ReadStored(ctx, b, "f")
	switch {
	case err != nil:
		t.Fatal(err)
	case st.Seq != 3 || st.Publisher != "m1" || !slices.Equal(st.Planned, []string{"m1"}) || st.Assignment["c"] != "m2" || st.Leader.Holder != "m1":
		t.Fatalf("the fleet as read: %+v", st)
	case len(st.Members) != 2 || st.Members[0].ID != "m1" || st.Members[1].ID != "m2":
		t.Fatalf("the members as read: %+v, want m1 and m2", st.Members)
	case st.Members[0].Weight != 2 || !slices.Equal(st.Members[0].Shards, []string{"a", "b"}) || st.Members[0].Leaving || !st.Members[1].Leaving:
		t.Fatalf("the members as read: %+v", st.Members)
	}
	names, err := StoredNames(ctx, b)
	if err != nil || !slices.Equal(names, []string{"f", "g"}) {
		t.Fatalf("the fleets stored: %v, %v, want f and g", names, err)
	}

	if _, err := b.PutBytes(ctx, assignmentKey("f"), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	st, err = ReadStored(ctx, b, "f")
	if !errors.Is(err, ErrCorrupt) || len(st.Members) != 2 {
		t.Fatalf("a corrupt assignment: %v, %+v; want ErrCorrupt with the rest read", err, st)
	}
}
