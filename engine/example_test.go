package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/local"
)

func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "l0-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// Parts and manifests go to an object store; here a local directory.
	store, err := local.New(filepath.Join(dir, "bucket"))
	if err != nil {
		log.Fatal(err)
	}
	bucket, err := substrate.New(store, substrate.Options{Name: "local"})
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	e, err := engine.Open(ctx, engine.Options{Dir: filepath.Join(dir, "engine"), Bucket: bucket})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "orders-7")
	if err != nil {
		log.Fatal(err)
	}
	// Append returns once the records are durable, with the first one's offset.
	first, err := sh.Append(ctx, []byte("created"), []byte("paid"))
	if err != nil {
		log.Fatal(err)
	}
	next, err := sh.Append(ctx, []byte("shipped"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("appended at", first, "and", next)

	// Close seals what is unsealed into a part and releases the shard's lease.
	if err := sh.Close(ctx); err != nil {
		log.Fatal(err)
	}
	sh, err = e.OpenShard(ctx, "orders-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("parts:", len(sh.Manifest().Parts), "sealed through", sh.Info().Sealed)
	for rec, err := range sh.Read(ctx, 1) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: %s\n", rec.Offset, rec.Value)
	}
	// Output:
	// appended at 0 and 2
	// parts: 1 sealed through 3
	// 1: paid
	// 2: shipped
}

// What README.md's engine snippet names and leaves to the reader: the buckets of
// two replicas, records, and error handling (check stands for the caller's).
var (
	ctx                    = context.Background()
	localBucket, gcsBucket *substrate.Bucket
	rec1, rec2             []byte
)

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// consume stands for what a consumer does with a record.
func consume(rec shard.Record) { _ = rec }

// The snippet in README.md, verbatim: a test in tests/ compares the two.
func Example_readme() {
	e, err := engine.Open(ctx, engine.Options{Dir: "/var/lib/l0", Replicas: []replica.Spec{
		{Name: "local", Domain: "node-a", Bucket: localBucket},
		{Name: "gcs", Domain: "gcp-eu", Bucket: gcsBucket},
	}, Authority: "gcs"})
	check(err)
	sh, err := e.OpenShard(ctx, "orders-7") // takes the lease, seals inherited pages
	check(err)
	first, err := sh.Append(ctx, rec1, rec2) // durable on return; offsets first, first+1
	check(err)
	for rec, err := range sh.Read(ctx, first, shard.Until(first+2)) { // sealed parts, then the WAL
		check(err)
		fmt.Printf("%d: %s\n", rec.Offset, rec.Value)
	}
	go func() { // a consumer: each record as soon as it is acknowledged, until ctx ends
		for rec, err := range sh.Read(ctx, first, shard.Follow()) {
			if err != nil {
				return // ctx ended, or the shard closed or moved
			}
			consume(rec)
		}
	}()
	queued, err := e.BackfillUnderReplicated(ctx) // after attaching a replica: copy history
	check(err)
	fmt.Println("parts queued for a copy:", queued)
	check(e.FlushAndWaitUploads(ctx))
	check(sh.Close(ctx)) // seal the tail, release the lease
	check(e.Close())
}

// A Reader follows a shard from another process, without its lease: it reads the
// sealed parts and the records the owner shipped to its tail on the object store.
func ExampleOpenReader() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "l0-example-reader")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := local.New(filepath.Join(dir, "bucket"))
	if err != nil {
		log.Fatal(err)
	}
	bucket, err := substrate.New(store, substrate.Options{Name: "local"})
	if err != nil {
		log.Fatal(err)
	}
	defer bucket.Close()

	// The owner, on its machine.
	e, err := engine.Open(ctx, engine.Options{Dir: filepath.Join(dir, "engine"), Bucket: bucket})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "orders-7")
	if err != nil {
		log.Fatal(err)
	}
	appended := make(chan error, 1)
	go func() {
		for _, v := range []string{"created", "paid", "shipped"} {
			if _, err := sh.Append(ctx, []byte(v)); err != nil {
				appended <- err
				return
			}
		}
		appended <- nil
	}()

	// A reader, anywhere the bucket is.
	r, err := engine.OpenReader(ctx, engine.ReaderOptions{Bucket: bucket})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	// Follow waits for each record until the owner has shipped it; Until ends
	// the read before offset 3.
	for rec, err := range r.Read(ctx, "orders-7", 0, shard.Follow(), shard.Until(3)) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: %s\n", rec.Offset, rec.Value)
	}
	// A record can be on the tail before its append returns.
	if err := <-appended; err != nil {
		log.Fatal(err)
	}
	// Output:
	// 0: created
	// 1: paid
	// 2: shipped
}
