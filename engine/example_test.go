package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/l0store/l0/engine"
)

func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "l0-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	e, err := engine.Open(ctx, engine.Options{Dir: dir})
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

	for rec, err := range sh.Read(ctx, 1) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: %s\n", rec.Offset, rec.Value)
	}
	// Output:
	// appended at 0 and 2
	// 1: paid
	// 2: shipped
}
