package engine

import (
	"context"
	"testing"
	"time"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/substratetest"
)

// liveStream is a shard's tail laid out by hand: a manifest pointing at
// incarnation 1 of instance i's stream, whose objects the test puts.
func liveStream(t *testing.T) (*substrate.Bucket, *tail.Stream) {
	t.Helper()
	b := substratetest.NewBucket(t, "store", nil)
	m := manifest.Manifest{Shard: "x", Epoch: 1, Seq: 1, Owner: "i", Tail: &manifest.Tail{Replica: "store", Instance: "i", Incarnation: 1}}
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PutBytes(t.Context(), manifest.Key("x"), data); err != nil {
		t.Fatal(err)
	}
	return b, tail.NewStream(b, "i", 1, 0, "w")
}

func put(t *testing.T, s *tail.Stream, secs ...tail.Section) {
	t.Helper()
	if _, err := s.Put(t.Context(), secs); err != nil {
		t.Fatal(err)
	}
}

func vals(vs ...string) [][]byte {
	out := make([][]byte, len(vs))
	for i, v := range vs {
		out[i] = []byte(v)
	}
	return out
}

// TestAFollowingReaderReadsOnInTheLiveStreamOnce: a follower reads on in the
// owner's live incarnation object by object (not the whole tail each poll). A
// section that repeats records it returned (a put retried at the next sequence),
// one of another epoch, and one of another shard are passed over; each record is
// returned once, in order. A fence there ends the reading on: the next pass reads
// the manifest, and the chain.
func TestAFollowingReaderReadsOnInTheLiveStreamOnce(t *testing.T) {
	b, s := liveStream(t)
	put(t, s, tail.Section{Shard: "x", Epoch: 1, First: 0, Records: vals("a", "b")})
	r, err := OpenReader(t.Context(), ReaderOptions{Bucket: b, Poll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a liveness bound
	defer cancel()
	got := make(chan shard.Record, 16)
	go func() {
		for rec, err := range r.Read(ctx, "x", 0, shard.Follow()) {
			if err != nil {
				return
			}
			got <- rec
		}
	}()
	want := []string{"a", "b"}
	expect := func() {
		t.Helper()
		for len(want) > 0 {
			select {
			case rec := <-got:
				if string(rec.Value) != want[0] {
					t.Fatalf("the reader returned %q at %d, want %q", rec.Value, rec.Offset, want[0])
				}
				want = want[1:]
			case <-ctx.Done():
				t.Fatalf("the reader did not return %q", want)
			}
		}
	}
	expect()
	put(t, s,
		tail.Section{Shard: "x", Epoch: 1, First: 1, Records: vals("b", "c")}, // b again
		tail.Section{Shard: "y", Epoch: 1, First: 0, Records: vals("other shard")})
	put(t, s, tail.Section{Shard: "x", Epoch: 0, First: 3, Records: vals("another epoch's")})
	put(t, s, tail.Section{Shard: "x", Epoch: 1, First: 3, Records: vals("d")})
	want = []string{"c", "d"}
	expect()
	// Idle, each poll is one request (the next object's attributes), and one
	// read of the manifest a second; a pass that read the tail again would make
	// a dozen.
	before, start := requestsOf(b), time.Now()
	select {
	case rec := <-got:
		t.Fatalf("the reader returned %q at %d past the end", rec.Value, rec.Offset)
	case <-time.After(200 * time.Millisecond):
	}
	polls := float64(time.Since(start)) / float64(5*time.Millisecond)
	if n := float64(requestsOf(b) - before); n > 2*polls+4 {
		t.Errorf("an idle follower made %.0f requests in %.0f polls: it reads more than the next object each poll", n, polls)
	}
}

func requestsOf(b *substrate.Bucket) uint64 {
	st := b.Stats()
	var n uint64
	for _, op := range substrate.Ops {
		n += st.Total(op)
	}
	return n
}
