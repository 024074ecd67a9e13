package local_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/mem"
)

// The walk prunes directories by prefix and resume key, and orders a directory "x"
// as "x/". Keys over a tiny alphabet that sorts around '/' ('!', '-', '.', '0' below
// and above it) give many keys that are prefixes of one another, where pruning and
// ordering go wrong first; mem, which sorts a flat map, is the reference.
func TestTheListingAgreesWithMemOnRandomKeys(t *testing.T) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab-.0!~/"
	seen := map[string]bool{}
	var keys []string
	for len(keys) < 300 {
		k := make([]byte, 1+rng.IntN(7))
		for i := range k {
			k[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if substrate.ValidateKey(string(k)) == nil && !seen[string(k)] {
			seen[string(k)] = true
			keys = append(keys, string(k))
		}
	}
	d, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lb, err := substrate.New(d, substrate.Options{Name: "local"})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	mb, err := substrate.New(mem.New(), substrate.Options{Name: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	for _, k := range keys {
		for _, b := range []*substrate.Bucket{lb, mb} {
			if _, err := b.PutBytes(ctx, k, []byte(k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func(b *substrate.Bucket, prefix, after string, limit int) []string {
		var got []string
		opts := substrate.ListOptions{StartAfter: after, Limit: limit}
		for {
			page, err := b.List(ctx, prefix, opts)
			if err != nil {
				t.Fatalf("%s: list %q after %q: %v", b.Name(), prefix, after, err)
			}
			for _, e := range page.Entries {
				got = append(got, e.Key)
			}
			if page.Next == "" {
				return got
			}
			opts.StartAfter = page.Next
		}
	}
	slices.Sort(keys)
	for range 400 {
		prefix := ""
		if rng.IntN(3) > 0 {
			k := keys[rng.IntN(len(keys))]
			prefix = k[:rng.IntN(len(k)+1)]
			if prefix != "" && substrate.ValidateKey(strings.TrimSuffix(prefix, "/")) != nil {
				continue
			}
		}
		after := ""
		if rng.IntN(2) == 0 {
			after = keys[rng.IntN(len(keys))]
		}
		limit := 1 + rng.IntN(5)
		if got, want := list(lb, prefix, after, limit), list(mb, prefix, after, limit); !slices.Equal(got, want) {
			t.Fatalf("prefix %q after %q, pages of %d:\nlocal %q\nmem   %q", prefix, after, limit, got, want)
		}
	}
}
