package tail

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// forEachChainBackend runs f with a constructor of drivers of each backend.
func forEachChainBackend(t *testing.T, f func(t *testing.T, newDriver func() substrate.Driver)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) { f(t, func() substrate.Driver { return be.driver(t) }) })
	}
}

// bucketOn returns a bucket of its own over d.
func bucketOn(t *testing.T, d substrate.Driver, name string) *substrate.Bucket {
	t.Helper()
	b, err := substrate.New(d, substrate.Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func lastLive(t *testing.T, c Chain) uint64 {
	t.Helper()
	l, ok := c.Live()
	if !ok {
		t.Fatalf("chain %+v has no live incarnation", c)
	}
	return l.N
}

func TestAChainRoundTripsThroughTheStore(t *testing.T) {
	forEachChainBackend(t, func(t *testing.T, newDriver func() substrate.Driver) {
		ctx := context.Background()
		b := bucketOn(t, newDriver(), "chain")
		c, ver, err := ReadChain(ctx, b, "a")
		if err != nil || ver != "" || !reflect.DeepEqual(c, Chain{Instance: "a"}) {
			t.Fatalf("absent chain: %+v %q %v", c, ver, err)
		}
		if _, err := Reincarnate(ctx, b, "a", 1, 4, 2); err != nil {
			t.Fatal(err)
		}
		if _, err := MarkTaken(ctx, b, "a", "x", 3); err != nil {
			t.Fatal(err)
		}
		wrote, err := Reincarnate(ctx, b, "a", 2, 9, 5)
		if err != nil {
			t.Fatal(err)
		}
		want := Chain{
			Instance:     "a",
			Incarnations: []Incarnation{{N: 1, End: 4, Ended: true}, {N: 2, End: 9, Ended: true}, {N: 5}},
			Marks:        []Mark{{Shard: "x", Epoch: 3}},
		}
		if !reflect.DeepEqual(wrote, want) {
			t.Fatalf("Reincarnate wrote %+v, want %+v", wrote, want)
		}
		got, ver, err := ReadChain(ctx, b, "a")
		if err != nil || ver == "" || !reflect.DeepEqual(got, want) {
			t.Fatalf("read %+v %q %v, want %+v", got, ver, err, want)
		}
		raw, _, err := b.Get(ctx, "instances/a/tail-chain")
		if err != nil {
			t.Fatal(err)
		}
		if again, err := EncodeChain(got); err != nil || !bytes.Equal(again, raw) {
			t.Fatalf("re-encoded %q %v, stored %q", again, err, raw)
		}
		if !got.Taken("x", 3) || got.Taken("x", 4) || got.Taken("y", 3) {
			t.Fatalf("Taken of %+v", got.Marks)
		}
	})
}

func TestAReaderFollowsTheChainFromItsIncarnation(t *testing.T) {
	c := Chain{Instance: "a", Incarnations: []Incarnation{{N: 1, End: 4, Ended: true}, {N: 3, End: 2, Ended: true}, {N: 7}}}
	for _, tc := range []struct {
		from uint64
		want []uint64
	}{{0, []uint64{1, 3, 7}}, {1, []uint64{1, 3, 7}}, {3, []uint64{3, 7}}, {7, []uint64{7}}, {8, nil}} {
		var got []uint64
		for _, inc := range c.From(tc.from) {
			got = append(got, inc.N)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("From(%d) = %v, want %v", tc.from, got, tc.want)
		}
	}
}

// A Reincarnate races many MarkTaken calls, each on a bucket of its own over one
// driver: every mark lands, each incarnation is in the chain once, and each call's
// chain is the one it wrote: a mark written before the reincarnation is in the
// chain Reincarnate returns, and one written after names the new incarnation as
// the live one.
func TestAReincarnationSeesEveryMarkWrittenBeforeIt(t *testing.T) {
	const marks, rounds = 8, 6
	forEachChainBackend(t, func(t *testing.T, newDriver func() substrate.Driver) {
		ctx := context.Background()
		d := newDriver()
		before, after := 0, 0
		for r := range rounds {
			inst := fmt.Sprintf("i%d", r)
			if _, err := Reincarnate(ctx, bucketOn(t, d, "setup"), inst, 1, 3, 2); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			got := make([]Chain, marks)
			errs := make([]error, marks+1)
			var re Chain
			start := make(chan struct{})
			for i := range marks {
				b := bucketOn(t, d, fmt.Sprintf("m%d", i))
				wg.Go(func() {
					<-start
					got[i], errs[i] = MarkTaken(ctx, b, inst, fmt.Sprintf("s%d", i), uint64(r))
				})
			}
			b := bucketOn(t, d, "owner")
			wg.Go(func() {
				<-start
				re, errs[marks] = Reincarnate(ctx, b, inst, 2, 11, 3)
			})
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			final, _, err := ReadChain(ctx, b, inst)
			if err != nil {
				t.Fatal(err)
			}
			wantIncs := []Incarnation{{N: 1, End: 3, Ended: true}, {N: 2, End: 11, Ended: true}, {N: 3}}
			if !reflect.DeepEqual(final.Incarnations, wantIncs) || len(final.Marks) != marks {
				t.Fatalf("final chain %+v", final)
			}
			if !reflect.DeepEqual(re.Incarnations, wantIncs) {
				t.Fatalf("Reincarnate returned %+v", re)
			}
			for i := range marks {
				shard := fmt.Sprintf("s%d", i)
				if !final.Taken(shard, uint64(r)) || !got[i].Taken(shard, uint64(r)) {
					t.Fatalf("mark %s: final %+v, returned %+v", shard, final.Marks, got[i].Marks)
				}
				live := lastLive(t, got[i])
				if re.Taken(shard, uint64(r)) {
					before++
					if live != 2 {
						t.Fatalf("mark %s is in the chain Reincarnate wrote, but its own chain's live incarnation is %d", shard, live)
					}
				} else {
					after++
					if live != 3 {
						t.Fatalf("mark %s is not in the chain Reincarnate wrote, but its own chain's live incarnation is %d", shard, live)
					}
				}
			}
		}
		t.Logf("%d marks before the reincarnation, %d after", before, after)
	})
}

// hookDriver runs after, if set, once a put has reached the driver beneath.
type hookDriver struct {
	substrate.Driver
	mu    sync.Mutex
	after func()
}

func (h *hookDriver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	a, err := h.Driver.Put(ctx, key, body, cond)
	h.mu.Lock()
	f := h.after
	h.after = nil
	h.mu.Unlock()
	if err == nil && f != nil {
		f()
	}
	return a, err
}

func TestALostReplyOnAChainWriteIsSettledAsLanded(t *testing.T) {
	lost := errors.New("reply lost")
	forEachChainBackend(t, func(t *testing.T, newDriver func() substrate.Driver) {
		ctx := context.Background()
		fd := fault.Wrap(newDriver(), 1)
		b := bucketOn(t, fd, "lossy")
		fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 1, Ambiguous: true, Err: lost})
		c, err := Reincarnate(ctx, b, "a", 1, 0, 2)
		if err != nil || lastLive(t, c) != 2 {
			t.Fatalf("first chain write: %+v %v", c, err)
		}
		fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: lost})
		c, err = MarkTaken(ctx, b, "a", "x", 1)
		if err != nil || !c.Taken("x", 1) || lastLive(t, c) != 2 {
			t.Fatalf("mark: %+v %v", c, err)
		}
		fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: lost})
		c, err = Reincarnate(ctx, b, "a", 2, 5, 3)
		if err != nil || lastLive(t, c) != 3 || !c.Taken("x", 1) {
			t.Fatalf("reincarnation: %+v %v", c, err)
		}
		if fd.Injected() != 3 {
			t.Fatalf("%d faults injected, want 3", fd.Injected())
		}
		final, _, err := ReadChain(ctx, b, "a")
		want := Chain{Instance: "a", Incarnations: []Incarnation{{N: 1, Ended: true}, {N: 2, End: 5, Ended: true}, {N: 3}}, Marks: []Mark{{Shard: "x", Epoch: 1}}}
		if err != nil || !reflect.DeepEqual(final, want) {
			t.Fatalf("final chain %+v %v, want %+v", final, err, want)
		}
	})
}

// A write whose reply is lost and which another write follows before the read
// back: the bytes differ, but the chain holds the write, so it landed.
func TestALostReplyFollowedByAnotherWriteIsSettledAsLanded(t *testing.T) {
	forEachChainBackend(t, func(t *testing.T, newDriver func() substrate.Driver) {
		ctx := context.Background()
		inner := newDriver()
		hd := &hookDriver{Driver: inner}
		fd := fault.Wrap(hd, 1)
		b := bucketOn(t, fd, "lossy")
		other := bucketOn(t, inner, "other")
		others := 0
		if _, err := Reincarnate(ctx, b, "a", 1, 0, 2); err != nil {
			t.Fatal(err)
		}
		for _, write := range []func() (Chain, error){
			func() (Chain, error) { return Reincarnate(ctx, b, "a", 2, 7, 3) },
			func() (Chain, error) { return MarkTaken(ctx, b, "a", "x", 1) },
		} {
			hd.mu.Lock()
			hd.after = func() {
				others++
				if _, err := MarkTaken(ctx, other, "a", fmt.Sprintf("o%d", others), 1); err != nil {
					t.Error(err)
				}
			}
			hd.mu.Unlock()
			fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Ambiguous: true, Err: errors.New("reply lost")})
			if _, err := write(); err != nil {
				t.Fatal(err)
			}
		}
		final, _, err := ReadChain(ctx, b, "a")
		want := Chain{Instance: "a",
			Incarnations: []Incarnation{{N: 1, Ended: true}, {N: 2, End: 7, Ended: true}, {N: 3}},
			Marks:        []Mark{{Shard: "o1", Epoch: 1}, {Shard: "x", Epoch: 1}, {Shard: "o2", Epoch: 1}}}
		if err != nil || !reflect.DeepEqual(final, want) {
			t.Fatalf("final chain %+v %v, want %+v", final, err, want)
		}
	})
}

// A write that failed and left the chain as it was may still be in flight: its
// outcome is unknown, and the next write settles it.
func TestAFailedChainWriteOnAnUnmovedChainIsAnUnknownOutcome(t *testing.T) {
	forEachChainBackend(t, func(t *testing.T, newDriver func() substrate.Driver) {
		ctx := context.Background()
		fd := fault.Wrap(newDriver(), 1)
		b := bucketOn(t, fd, "lossy")
		if _, err := Reincarnate(ctx, b, "a", 1, 0, 2); err != nil {
			t.Fatal(err)
		}
		fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpCompareAndSwap}, Nth: 1, Err: fault.ErrInjected})
		if _, err := MarkTaken(ctx, b, "a", "x", 1); !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("MarkTaken = %v, want ErrUnknownOutcome", err)
		}
		fd.SetRules()
		c, err := MarkTaken(ctx, b, "a", "x", 1)
		if err != nil || !reflect.DeepEqual(c.Marks, []Mark{{Shard: "x", Epoch: 1}}) {
			t.Fatalf("again: %+v %v", c, err)
		}
	})
}

// sealed frames body as a chain object of version v with a valid checksum.
func sealed(v byte, body string) []byte {
	b := append([]byte(chainMagic), v)
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func TestACorruptChainIsRefused(t *testing.T) {
	good, err := EncodeChain(Chain{Instance: "a", Incarnations: []Incarnation{{N: 1, End: 2, Ended: true}, {N: 2}}, Marks: []Mark{{Shard: "x", Epoch: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	flipped := slices.Clone(good)
	flipped[len(chainMagic)+5] ^= 1
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"a bit flipped", flipped},
		{"truncated", good[:len(good)-1]},
		{"unknown version", sealed(2, `{"instance":"a"}`)},
		{"unknown field", sealed(1, `{"instance":"a","x":1}`)},
		{"not canonical", sealed(1, `{ "instance":"a"}`)},
		{"empty list spelled out", sealed(1, `{"instance":"a","marks":[]}`)},
		{"another instance's", sealed(1, `{"instance":"b"}`)},
		{"incarnations descending", sealed(1, `{"instance":"a","incarnations":[{"n":2,"end":1,"ended":true},{"n":1}]}`)},
		{"an incarnation twice", sealed(1, `{"instance":"a","incarnations":[{"n":1,"end":1,"ended":true},{"n":1,"end":1,"ended":true}]}`)},
		{"two live", sealed(1, `{"instance":"a","incarnations":[{"n":1},{"n":2}]}`)},
		{"live not last", sealed(1, `{"instance":"a","incarnations":[{"n":1},{"n":2,"end":1,"ended":true}]}`)},
		{"a mark twice", sealed(1, `{"instance":"a","marks":[{"shard":"x","epoch":1},{"shard":"x","epoch":1}]}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := bucketOn(t, fault.Wrap(backends[0].driver(t), 1), "mem")
			if _, err := b.PutBytes(ctx, ChainKey("a"), tc.data); err != nil {
				t.Fatal(err)
			}
			_, _, rerr := ReadChain(ctx, b, "a")
			_, merr := MarkTaken(ctx, b, "a", "y", 1)
			_, ierr := Reincarnate(ctx, b, "a", 5, 1, 6)
			for _, err := range []error{rerr, merr, ierr} {
				var ce *ChainCorruptError
				if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
					t.Fatalf("got %v, want a *ChainCorruptError", err)
				}
			}
			if after, _, _ := b.Get(ctx, ChainKey("a")); !bytes.Equal(after, tc.data) {
				t.Fatalf("the corrupt chain was written over")
			}
		})
	}
}

func TestAReincarnationThatDoesNotMoveForwardIsRefused(t *testing.T) {
	ctx := context.Background()
	b := bucketOn(t, backends[0].driver(t), "mem")
	if _, err := Reincarnate(ctx, b, "a", 3, 0, 5); err != nil {
		t.Fatal(err)
	}
	_, ver, err := ReadChain(ctx, b, "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		live, end, next uint64
	}{
		{"next is the live one", 5, 2, 5},
		{"next is below the live one", 5, 2, 4},
		{"next is an ended one", 5, 2, 3},
		{"next below the unlisted one it ends", 9, 2, 8},
		{"ends one below the chain", 4, 2, 6},
		{"ends one that is not live", 6, 2, 7},
		{"ends one at another fence", 3, 1, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Reincarnate(ctx, b, "a", tc.live, tc.end, tc.next)
			var ie *IncarnationError
			if !errors.Is(err, ErrIncarnation) || !errors.As(err, &ie) {
				t.Fatalf("got %v, want an *IncarnationError", err)
			}
			if _, now, _ := ReadChain(ctx, b, "a"); now != ver {
				t.Fatalf("a refused Reincarnate wrote the chain")
			}
		})
	}
	// The write already made is no error, and no write.
	c, err := Reincarnate(ctx, b, "a", 3, 0, 5)
	if _, now, _ := ReadChain(ctx, b, "a"); err != nil || now != ver || lastLive(t, c) != 5 {
		t.Fatalf("the same Reincarnate again: %+v %v, version moved: %v", c, err, now != ver)
	}
}

func TestAMarkAlreadyTakenIsNotWrittenAgain(t *testing.T) {
	ctx := context.Background()
	b := bucketOn(t, backends[0].driver(t), "mem")
	if _, err := MarkTaken(ctx, b, "a", "x", 1); err != nil {
		t.Fatal(err)
	}
	_, ver, _ := ReadChain(ctx, b, "a")
	c, err := MarkTaken(ctx, b, "a", "x", 1)
	if _, now, _ := ReadChain(ctx, b, "a"); err != nil || now != ver || len(c.Marks) != 1 {
		t.Fatalf("marked again: %+v %v, version moved: %v", c, err, now != ver)
	}
}

func FuzzDecodeChain(f *testing.F) {
	good, _ := EncodeChain(Chain{Instance: "a", Incarnations: []Incarnation{{N: 1, End: 2, Ended: true}, {N: 2}}, Marks: []Mark{{Shard: "x", Epoch: 1}}})
	f.Add(good)
	empty, _ := EncodeChain(Chain{Instance: "a"})
	f.Add(empty)
	f.Add(sealed(1, `{"instance":"a","incarnations":[{"n":1},{"n":2}]}`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(data []byte) {
			c, err := DecodeChain(data)
			if err != nil {
				var ce *ChainCorruptError
				if !errors.As(err, &ce) {
					t.Fatalf("refused with %v, not a *ChainCorruptError", err)
				}
				return
			}
			again, err := EncodeChain(c)
			if err != nil {
				t.Fatalf("decoded but does not encode: %v", err)
			}
			if !bytes.Equal(again, data) {
				t.Fatalf("decoded %q, encodes back to %q", data, again)
			}
		}
		check(data)
		// And with the checksum recomputed, to get past it.
		if len(data) >= 4 {
			body := data[:len(data)-4]
			check(binary.BigEndian.AppendUint32(slices.Clone(body), crc32.Checksum(body, castagnoli)))
		}
	})
}
