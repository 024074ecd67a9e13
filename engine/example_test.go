package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/l0store/l0/engine"
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
