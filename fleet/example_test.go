package fleet_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// A server's loop: open the engine, join the fleet, route each append to the
// shard if this member has it open (or tell the client who should), and leave
// before closing the engine, so that every shard is handed over cooperatively.
func Example() {
	ctx := context.Background()
	bucket, _ := substrate.New(mem.New(), substrate.Options{Name: "shared"}) // GCS or S3 in production
	defer bucket.Close()
	dir, _ := os.MkdirTemp("", "l0-fleet-example")
	defer os.RemoveAll(dir)

	e, err := engine.Open(ctx, engine.Options{Dir: dir, Bucket: bucket})
	if err != nil {
		panic(err)
	}
	defer e.Close()
	catalog := []fleet.Shard{{ID: "orders-0"}, {ID: "orders-1"}, {ID: "orders-2"}, {ID: "orders-3", Weight: 2}}
	m, err := fleet.Join(ctx, e, fleet.Options{
		Weight:    1,
		Shards:    func(context.Context) ([]fleet.Shard, error) { return catalog, nil },
		PollEvery: 50 * time.Millisecond,
		Revoked:   func(id string) { /* stop routing appends for id here */ },
	})
	if err != nil {
		panic(err)
	}
	for len(m.Owned()) < len(catalog) { // the only member: every shard comes here
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("owns", m.Owned())

	// An append for a shard: through the member that has it open.
	if sh, ok := m.Shard("orders-3"); ok {
		off, err := sh.Append(ctx, []byte("order 1"))
		fmt.Println("appended at", off, err)
	}

	// Shutting down: hand every shard over, then close the engine.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fmt.Println("left:", m.Leave(lctx), "owns", m.Owned())
	// Output:
	// owns [orders-0 orders-1 orders-2 orders-3]
	// appended at 0 <nil>
	// left: <nil> owns []
}

// What README.md's fleet snippet names and leaves to the reader: the shared bucket,
// the server's catalog, a record, and error handling (check stands for the
// caller's).
var (
	ctx       = context.Background()
	gcsBucket *substrate.Bucket
	rec       []byte
)

// catalog returns every shard the fleet places, with its weight.
func catalog(context.Context) ([]fleet.Shard, error) {
	return []fleet.Shard{{ID: "orders-7"}, {ID: "orders-8", Weight: 2}}, nil
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

// The snippet in README.md, verbatim: a test in tests/ compares the two.
func Example_readme() {
	e, err := engine.Open(ctx, engine.Options{Dir: "/var/lib/l0", Bucket: gcsBucket})
	check(err)
	m, err := fleet.Join(ctx, e, fleet.Options{
		Weight:     4,               // this server's share, say its cores
		Shards:     catalog,         // a func returning every shard to place, with its weight
		ScanShards: 8,               // fleet-wide scans, one lease per scan shard
		Address:    "10.0.0.7:8080", // where this server takes requests
		Revoked:    func(id string) { /* stop routing id here */ },
	})
	check(err)
	if sh, ok := m.Shard("orders-7"); ok { // open here: serve it
		_, err := sh.Append(ctx, rec)
		check(err)
	} else { // redirect to whoever serves it now, or will once its handoff ends
		r, err := m.Route(ctx, "orders-7")
		check(err)
		redirect(cmp.Or(r.Owner.Address, r.Assignee.Address)) // both empty: retry later
	}
	check(m.Leave(ctx)) // hands every shard over, then
	check(e.Close())
}

// redirect stands for the server's redirect of a request to the member at addr.
func redirect(addr string) { _ = addr }
