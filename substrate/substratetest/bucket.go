package substratetest

import (
	"context"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// NewBucket wraps d (an in-memory driver when nil) in a Bucket named name that the
// test closes when it ends.
func NewBucket(t testing.TB, name string, d substrate.Driver) *substrate.Bucket {
	t.Helper()
	if d == nil {
		d = mem.New()
	}
	b, err := substrate.New(d, substrate.Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// CountObjects returns how many objects b holds under prefix.
func CountObjects(t testing.TB, b *substrate.Bucket, prefix string) int {
	t.Helper()
	n := 0
	for _, err := range b.ListAll(context.Background(), prefix) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}
