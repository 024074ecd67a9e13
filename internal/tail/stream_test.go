package tail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/mem"
)

// backends are the substrates the stream is tested on: in memory, a local
// directory, and fake-gcs-server through the GCS client over HTTP.
var backends = []struct {
	name   string
	driver func(t *testing.T) substrate.Driver
}{
	{"mem", func(*testing.T) substrate.Driver { return mem.New() }},
	{"local", func(t *testing.T) substrate.Driver {
		d, err := local.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}},
	{"gcs", func(t *testing.T) substrate.Driver {
		gcsOnce.Do(func() { gcsServer, gcsErr = emulator.StartGCSProcess() })
		if gcsErr != nil {
			t.Fatal(gcsErr)
		}
		d, err := gcsServer.NewDriver(context.Background(), fmt.Sprintf("l0-tail-%d", gcsNames.Add(1)))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}},
}

var (
	gcsOnce   sync.Once
	gcsServer *emulator.GCS
	gcsErr    error
	gcsNames  atomic.Int64
)

// TestMain stops the fake-gcs-server process the gcs backend started.
func TestMain(m *testing.M) {
	code := m.Run()
	if gcsServer != nil {
		gcsServer.Stop()
	}
	os.Exit(code)
}

// forEachBackend runs f on a bucket of each backend, its driver wrapped by wrap.
func forEachBackend(t *testing.T, f func(t *testing.T, newBucket func(wrap func(substrate.Driver) substrate.Driver) *substrate.Bucket)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			f(t, func(wrap func(substrate.Driver) substrate.Driver) *substrate.Bucket {
				d := be.driver(t)
				if wrap != nil {
					d = wrap(d)
				}
				b, err := substrate.New(d, substrate.Options{Name: be.name})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				return b
			})
		})
	}
}

// faulty wraps a driver in rules.
func faulty(rules ...fault.Rule) func(substrate.Driver) substrate.Driver {
	return func(d substrate.Driver) substrate.Driver { return fault.Wrap(d, 1, rules...) }
}

func records(n int, tag string) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%d", tag, i)
	}
	return out
}

func TestAStreamIsReadBackOneShardAtATime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		b := newBucket(nil)
		s := NewStream(b, "i-1", 2, 0, "w")
		flushes := [][]Section{
			{{Shard: "a", Epoch: 1, First: 0, Records: records(3, "a0")}, {Shard: "b", Epoch: 4, First: 10, Records: records(1, "b0")}},
			{{Shard: "b", Epoch: 4, First: 11, Records: records(2, "b1")}},
			{{Shard: "a", Epoch: 1, First: 3, Records: records(2, "a2")}},
		}
		for i, f := range flushes {
			if seq, err := s.Put(t.Context(), f); err != nil || seq != uint64(i) {
				t.Fatalf("put %d: sequence %d, %v", i, seq, err)
			}
		}
		got, err := ReadShard(t.Context(), b, "i-1", 2, 0, NoFence, "a")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Sequence != 0 || got[1].Sequence != 2 || got[1].First != 3 || !slices.EqualFunc(got[1].Records, records(2, "a2"), bytes.Equal) {
			t.Fatalf("shard a: %+v", got)
		}
		// From a later pointer, the earlier objects are not read.
		if got, err := ReadShard(t.Context(), b, "i-1", 2, 1, NoFence, "b"); err != nil || len(got) != 1 || got[0].First != 11 {
			t.Fatalf("shard b from 1: %+v %v", got, err)
		}
	})
}

// TestAPutWhoseReplyWasLostIsSettledByPuttingItAgain: the object landed but the
// writer was told it failed; putting the same sections again finds its own bytes and
// goes on, and other sections are refused until then.
func TestAPutWhoseReplyWasLostIsSettledByPuttingItAgain(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		b := newBucket(faulty(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 1, Err: fault.ErrInjected, Ambiguous: true}))
		s := NewStream(b, "i-1", 0, 0, "w")
		f := []Section{{Shard: "a", First: 0, Records: records(2, "x")}}
		if _, err := s.Put(t.Context(), f); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("first put: %v", err)
		}
		if _, err := s.Put(t.Context(), []Section{{Shard: "a", First: 0, Records: records(3, "x")}}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("other sections before the settle: %v", err)
		}
		if seq, err := s.Put(t.Context(), f); err != nil || seq != 0 {
			t.Fatalf("the same put again: %d %v", seq, err)
		}
		if seq, err := s.Put(t.Context(), []Section{{Shard: "a", First: 2, Records: records(1, "y")}}); err != nil || seq != 1 {
			t.Fatalf("the next put: %d %v", seq, err)
		}
	})
}

// TestAPutInDoubtAfterOneThatLandedKeepsItsOwnBytes: a stream lays each object out
// in the memory of the last one put; the object of a put in doubt is kept to be
// compared with the next, and the next must not be laid out over it, or any
// sections would compare equal to it and the settle would pass with other bytes.
func TestAPutInDoubtAfterOneThatLandedKeepsItsOwnBytes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		b := newBucket(faulty(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 2, Err: fault.ErrInjected, Ambiguous: true}))
		s := NewStream(b, "i-1", 0, 0, "w")
		if seq, err := s.Put(t.Context(), []Section{{Shard: "a", First: 0, Records: records(4, "w")}}); err != nil || seq != 0 {
			t.Fatalf("first put: %d %v", seq, err)
		}
		f := []Section{{Shard: "a", First: 4, Records: records(2, "x")}}
		if _, err := s.Put(t.Context(), f); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("second put: %v", err)
		}
		if _, err := s.Put(t.Context(), []Section{{Shard: "a", First: 4, Records: records(2, "y")}}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("other sections before the settle: %v", err)
		}
		if seq, err := s.Put(t.Context(), f); err != nil || seq != 1 {
			t.Fatalf("the same put again: %d %v", seq, err)
		}
		got, _, err := b.Get(t.Context(), Key("i-1", 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		want, err := Encode(Header{Instance: "i-1", Sequence: 1, Writer: "w"}, f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("the object in doubt is not the bytes of its sections")
		}
	})
}

// TestAFencedStreamAcceptsNothingMore: the fence goes at the first free sequence,
// the writer's next put fails, a second fence meets the first, and the stream reads
// up to it.
func TestAFencedStreamAcceptsNothingMore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		b := newBucket(nil)
		s := NewStream(b, "i-1", 5, 0, "w")
		for i := range 3 {
			if _, err := s.Put(t.Context(), []Section{{Shard: "a", First: uint64(i), Records: records(1, "r")}}); err != nil {
				t.Fatal(err)
			}
		}
		seq, met, err := Fence(t.Context(), b, "i-1", 5, 1)
		if err != nil || seq != 3 || met {
			t.Fatalf("fence: %d %v %v", seq, met, err)
		}
		if _, err := s.Put(t.Context(), []Section{{Shard: "a", First: 3, Records: records(1, "late")}}); !errors.Is(err, ErrFenced) {
			t.Fatalf("a put after the fence: %v", err)
		}
		if again, met, err := Fence(t.Context(), b, "i-1", 5, 0); err != nil || again != 3 || !met {
			t.Fatalf("second fence: %d %v %v", again, met, err)
		}
		for _, until := range []uint64{3, NoFence} {
			if got, err := ReadShard(t.Context(), b, "i-1", 5, 0, until, "a"); err != nil || len(got) != 3 {
				t.Fatalf("read until %d: %d sections, %v", until, len(got), err)
			}
		}
		// Another incarnation of the instance is another stream, not fenced.
		if _, err := NewStream(b, "i-1", 6, 0, "w").Put(t.Context(), []Section{{Shard: "a", First: 3, Records: records(1, "new")}}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAFenceWhoseReplyWasLostIsMetWhenRetried: a fence is idempotent.
func TestAFenceWhoseReplyWasLostIsMetWhenRetried(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		b := newBucket(faulty(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 1, Err: fault.ErrInjected, Ambiguous: true}))
		if _, _, err := Fence(t.Context(), b, "i-1", 0, 0); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("first fence: %v", err)
		}
		if seq, met, err := Fence(t.Context(), b, "i-1", 0, 0); err != nil || seq != 0 || !met {
			t.Fatalf("retried fence: %d %v %v", seq, met, err)
		}
	})
}

// TestAWriterRacingAFenceLosesNothingItWasToldWasDurable: whatever the interleaving,
// every put that succeeded is below the fence and reads back, and no put succeeds
// at or after it.
func TestAWriterRacingAFenceLosesNothingItWasToldWasDurable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		for round := range 30 {
			b := newBucket(nil)
			s := NewStream(b, "i-1", 0, 0, "w")
			var acked []uint64
			var wg sync.WaitGroup
			wg.Go(func() {
				for i := uint64(0); ; i++ {
					seq, err := s.Put(context.Background(), []Section{{Shard: "a", First: i, Records: records(1, fmt.Sprint(i))}})
					if errors.Is(err, ErrFenced) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					acked = append(acked, seq)
				}
			})
			fence, _, err := Fence(t.Context(), b, "i-1", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			got, err := ReadShard(t.Context(), b, "i-1", 0, 0, fence, "a")
			if err != nil {
				t.Fatal(err)
			}
			if uint64(len(got)) != fence || len(acked) != len(got) {
				t.Fatalf("round %d: fence at %d, %d objects below it, %d acknowledged (last %v)", round, fence, len(got), len(acked), acked)
			}
		}
	})
}

// writerFirst is a driver on which, for the fencer's first races, the writer gets
// to the sequence of each fence just before it is put: a writer that keeps winning.
type writerFirst struct {
	substrate.Driver
	races  int
	writer *Stream
	n      uint64
}

func (d *writerFirst) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	if size, _ := body.Seek(0, io.SeekEnd); size == 0 && d.races > 0 {
		d.races--
		seq, _ := strconv.ParseUint(key[strings.LastIndexByte(key, '/')+1:], 10, 64)
		for d.writer.Next() <= seq {
			d.n++
			if _, err := d.writer.Put(ctx, []Section{{Shard: "a", First: d.n, Records: records(1, "won")}}); err != nil {
				if errors.Is(err, ErrFenced) {
					break // the writer met a fence already
				}
				return substrate.Attrs{}, err
			}
		}
	}
	body.Seek(0, io.SeekStart)
	return d.Driver.Put(ctx, key, body, cond)
}

// TestAWriterThatKeepsWinningTheNextSequenceCannotStarveAFence: the fence goes
// further ahead after each lost race and fills the sequences it skipped, so the
// stream below the fence has no hole a late put could fill.
func TestAWriterThatKeepsWinningTheNextSequenceCannotStarveAFence(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		var d *writerFirst
		b := newBucket(func(next substrate.Driver) substrate.Driver { d = &writerFirst{Driver: next, races: 2}; return d })
		d.writer = NewStream(b, "i-1", 0, 0, "w")
		for i := range 3 {
			if _, err := d.writer.Put(t.Context(), []Section{{Shard: "a", First: uint64(100 + i), Records: records(1, "early")}}); err != nil {
				t.Fatal(err)
			}
		}
		fence, met, err := Fence(t.Context(), b, "i-1", 0, 0)
		if err != nil || met {
			t.Fatalf("fence %d %v %v", fence, met, err)
		}
		if want := d.writer.Next(); fence != want {
			t.Fatalf("fence at %d, the writer's next sequence is %d", fence, want)
		}
		if _, err := d.writer.Put(t.Context(), []Section{{Shard: "a", First: 999, Records: records(1, "late")}}); !errors.Is(err, ErrFenced) {
			t.Fatalf("a put after the fence: %v", err)
		}
		got, err := ReadShard(t.Context(), b, "i-1", 0, 0, fence, "a")
		if err != nil || uint64(len(got)) != fence {
			t.Fatalf("%d objects below the fence at %d: %v", len(got), fence, err)
		}
	})
}
