package substrate_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// emptyPages answers a list with an empty page that says more follow on the calls
// that empty selects, and truthfully otherwise.
type emptyPages struct {
	substrate.Driver
	calls int
	empty func(call int) bool
}

func (d *emptyPages) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	d.calls++
	if d.empty(d.calls) {
		return nil, true, nil
	}
	return d.Driver.List(ctx, prefix, startAfter, limit)
}

func TestAnEmptyPageWithMoreToFollowDoesNotEndTheListing(t *testing.T) {
	ctx := t.Context()
	d := &emptyPages{Driver: mem.New(), empty: func(call int) bool { return call%3 != 0 }}
	b, err := substrate.New(d, substrate.Options{Name: "gaps"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 25
	for i := range n {
		if _, err := b.PutBytes(ctx, fmt.Sprintf("p/%02d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	var got int
	for _, err := range b.ListAll(ctx, "p/") {
		if err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != n {
		t.Fatalf("list all saw %d keys, want %d", got, n)
	}
	// Page by page, with pages smaller than the listing, the same: a page is empty
	// only at the end.
	got = 0
	opts := substrate.ListOptions{Limit: 4}
	for {
		page, err := b.List(ctx, "p/", opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Entries) == 0 && page.Next != "" {
			t.Fatalf("empty page with next %q", page.Next)
		}
		got += len(page.Entries)
		if page.Next == "" {
			break
		}
		opts.StartAfter = page.Next
	}
	if got != n {
		t.Fatalf("pages of 4 held %d keys, want %d", got, n)
	}
}

func TestAListingOfEmptyPagesThatNeverEndsIsAnError(t *testing.T) {
	ctx := t.Context()
	d := &emptyPages{Driver: mem.New(), empty: func(int) bool { return true }}
	b, err := substrate.New(d, substrate.Options{Name: "stuck"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.PutBytes(ctx, "p/k", nil); err != nil {
		t.Fatal(err)
	}
	var errs int
	for _, err := range b.ListAll(ctx, "p/") {
		if err == nil {
			t.Fatal("a listing of only empty pages yielded a key")
		}
		errs++
	}
	if errs != 1 {
		t.Fatalf("a listing of only empty pages ended with %d errors, want 1 (not a silent, empty listing)", errs)
	}
}
