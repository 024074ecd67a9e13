package ownership_test

import (
	"context"
	"fmt"
	"time"

	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// An instance takes its lease once, owns a shard under it, commits a part and
// gives the shard up.
func Example() {
	ctx := context.Background()
	authority, _ := substrate.New(mem.New(), substrate.Options{Name: "auth"})
	defer authority.Close()
	st := ownership.NewStore(authority)
	defer st.Close()

	opts := ownership.LeaseOptions{}
	opts.EnsureDefaults()
	held, err := lease.Acquire(ctx, authority, lease.InstanceKey("i1"), "i1", nil, opts.LeaseOf())
	if err != nil {
		panic(err)
	}
	o, _, err := ownership.Acquire(ctx, st, "orders-7", held, opts, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("epoch", o.Epoch(), "valid:", o.Valid() == nil) // check before acknowledging

	p := manifest.Part{Key: manifest.PartKey("orders-7", 0, 10, o.Epoch(), "n1"), First: 0, Count: 10,
		Size: 512, Epoch: o.Epoch(), SealedAt: time.Now(), Replicas: []string{"auth"}}
	if err := o.Commit(ctx, p); err != nil {
		panic(err)
	}
	fmt.Println("sealed to", o.Sealed())

	if err := o.Release(ctx); err != nil {
		panic(err)
	}
	_, _, err = ownership.Acquire(ctx, st, "orders-7", held, opts, nil) // released: taken at once
	fmt.Println("again:", err)
	// Output:
	// epoch 1 valid: true
	// sealed to 10
	// again: <nil>
}
