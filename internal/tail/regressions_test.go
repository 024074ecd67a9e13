// Regressions: each test reproduced a way the stream, the fence or the flusher
// broke their guarantees before it was fixed; the comments say what used to happen.
package tail

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
)

// afterPut runs hook once, right after the put of key returned.
type afterPut struct {
	substrate.Driver
	key  string
	once sync.Once
	hook func(ctx context.Context)
}

func (d *afterPut) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	a, err := d.Driver.Put(ctx, key, body, cond)
	if key == d.key {
		d.once.Do(func() { d.hook(ctx) })
	}
	return a, err
}

// lagging is a driver whose listings miss the keys in hide: a listing that lags
// behind the latest writes.
type lagging struct {
	substrate.Driver
	mu   sync.Mutex
	hide map[string]bool
}

func (d *lagging) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	es, more, err := d.Driver.List(ctx, prefix, startAfter, limit)
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []substrate.ListEntry
	for _, e := range es {
		if !d.hide[e.Key] {
			out = append(out, e)
		}
	}
	return out, more, err
}

// putEarly puts the writer's first n objects.
func putEarly(t *testing.T, s *Stream, n int) {
	t.Helper()
	for i := range n {
		if _, err := s.Put(t.Context(), []Section{{Shard: "a", First: uint64(100 + i), Records: records(1, "early")}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAFenceRetriedAfterItsTopPutWasLostLeavesNoHole: the writer wins the race
// for the first free sequence (3), so the fence goes ahead to 5; that put lands but
// its reply is lost. The retried Fence lists, finds the fence at 5 and returns it,
// though 4 was never filled: the stream below the fence has a hole, the new owner's
// read to the fence fails, and the fenced writer still acknowledges a put at 4 after
// Fence returned.
func TestAFenceRetriedAfterItsTopPutWasLostLeavesNoHole(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		var d *writerFirst
		b := newBucket(func(next substrate.Driver) substrate.Driver {
			fd := fault.Wrap(next, 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/0{19}5$", Nth: 1, Err: fault.ErrInjected, Ambiguous: true})
			d = &writerFirst{Driver: fd, races: 1}
			return d
		})
		d.writer = NewStream(b, "i-1", 0, 0, "w")
		putEarly(t, d.writer, 3)
		if _, _, err := Fence(t.Context(), b, "i-1", 0, 0); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("first fence: %v", err)
		}
		fence, _, err := Fence(t.Context(), b, "i-1", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ReadShard(t.Context(), b, "i-1", 0, 0, fence, "a"); err != nil || uint64(len(got)) != fence {
			t.Errorf("fence at %d: %d objects below it, %v", fence, len(got), err)
		}
		if seq, err := d.writer.Put(t.Context(), []Section{{Shard: "a", First: 999, Records: records(1, "late")}}); !errors.Is(err, ErrFenced) {
			t.Errorf("after Fence returned %d, the writer's put got sequence %d, %v", fence, seq, err)
		}
	})
}

// TestTwoFencersAtOnceLeaveNoHole: fencer A has put its fence ahead at 5 and not yet
// filled 4; fencer B lists, finds the fence at 5 and returns it. B's new owner
// cannot read to its fence, and the writer can still win 4 after B returned.
func TestTwoFencersAtOnceLeaveNoHole(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		var d *writerFirst
		var b *substrate.Bucket
		b = newBucket(func(next substrate.Driver) substrate.Driver {
			ap := &afterPut{Driver: next, key: Key("i-1", 0, 5)}
			ap.hook = func(ctx context.Context) {
				fence, _, err := Fence(ctx, b, "i-1", 0, 0) // fencer B, while A is between its top and its fill
				if err != nil {
					t.Error(err)
					return
				}
				if got, err := ReadShard(ctx, b, "i-1", 0, 0, fence, "a"); err != nil || uint64(len(got)) != fence {
					t.Errorf("fencer B: fence at %d, %d objects below it, %v", fence, len(got), err)
				}
			}
			d = &writerFirst{Driver: ap, races: 1}
			return d
		})
		d.writer = NewStream(b, "i-1", 0, 0, "w")
		putEarly(t, d.writer, 3)
		if _, _, err := Fence(t.Context(), b, "i-1", 0, 0); err != nil {
			t.Fatal(err)
		}
	})
}

// TestALaggingListingStillEndsAtTheLowestFence: a complete fence is at 4
// and 5 (5 put first, 4 filled after). A second Fence whose listing lags behind the
// latest write (4) returns 5, which is not the lowest fence: the read from the
// pointer to it meets the fence at 4 and fails.
func TestALaggingListingStillEndsAtTheLowestFence(t *testing.T) {
	forEachBackend(t, func(t *testing.T, newBucket func(func(substrate.Driver) substrate.Driver) *substrate.Bucket) {
		var d *writerFirst
		var lag *lagging
		b := newBucket(func(next substrate.Driver) substrate.Driver {
			lag = &lagging{Driver: next, hide: map[string]bool{}}
			d = &writerFirst{Driver: lag, races: 1}
			return d
		})
		d.writer = NewStream(b, "i-1", 0, 0, "w")
		putEarly(t, d.writer, 3)
		first, _, err := Fence(t.Context(), b, "i-1", 0, 0)
		if err != nil || first != 4 {
			t.Fatalf("first fence: %d %v", first, err)
		}
		lag.mu.Lock()
		lag.hide[Key("i-1", 0, 4)] = true
		lag.mu.Unlock()
		again, met, err := Fence(t.Context(), b, "i-1", 0, 0)
		if err != nil || again != first || !met {
			t.Errorf("second fence with a lagging listing: %d %v %v, the lowest fence is %d", again, met, err, first)
		}
		if _, err := ReadShard(t.Context(), b, "i-1", 0, 0, again, "a"); err != nil {
			t.Errorf("read to %d: %v", again, err)
		}
	})
}

// TestAnInvalidPageFailsAloneAndTheFlusherGoesOn: Add takes a page Encode refuses (an
// empty record, no records, an empty or too long shard id); ship retries the
// ErrInvalid put forever, so neither that page's ticket nor any other shard's is
// ever resolved.
func TestAnInvalidPageFailsAloneAndTheFlusherGoesOn(t *testing.T) {
	for name, recs := range map[string][][]byte{"an empty record": {{}}, "no records": nil} {
		t.Run(name, func(t *testing.T) {
			b := bucket(t)
			f := NewFlusher(NewStream(b, "i-1", 0, 0, "w"), FlushOptions{Interval: time.Millisecond, Retry: time.Millisecond})
			defer func() {
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				defer cancel()
				f.Close(ctx)
			}()
			bad := f.Add("a", 1, 0, recs)
			good := f.Add("b", 1, 0, records(1, "x"))
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			if err := bad.Wait(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the invalid page: %v", err)
			}
			if err := good.Wait(ctx); err != nil {
				t.Errorf("a valid page of another shard: %v (stats %+v)", err, f.Stats())
			}
		})
	}
}

// TestDecodeRefusesWhatEncodeWouldRefuse: a header with an empty instance
// decodes, and Encode refuses to write it back (the fuzz target's property).
func TestDecodeRefusesWhatEncodeWouldRefuse(t *testing.T) {
	crc := func(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
	data := append([]byte(magic), Version)
	data = binary.BigEndian.AppendUint64(data, 7) // sequence
	data = binary.BigEndian.AppendUint64(data, 2) // incarnation
	data = append(data, 0)                        // an empty instance
	data = append(data, 1, 'w')                   // writer
	data = binary.BigEndian.AppendUint32(data, crc(data))
	indexPos := len(data)
	data = binary.BigEndian.AppendUint64(data, 7)
	data = binary.BigEndian.AppendUint64(data, 2)
	data = binary.BigEndian.AppendUint32(data, 0) // no entries
	data = binary.BigEndian.AppendUint32(data, crc(data[indexPos:]))
	tr := binary.BigEndian.AppendUint64(nil, uint64(indexPos))
	tr = binary.BigEndian.AppendUint32(tr, uint32(len(data)-indexPos))
	tr = binary.BigEndian.AppendUint32(tr, crc(tr))
	data = append(data, append(append(tr, Version), magic...)...)

	h, _, _, err := Decode(data)
	if err != nil {
		return // refused: fine
	}
	again, err := Encode(h, nil)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("Decode accepted %+v; Encode gives %d bytes, %v", h, len(again), err)
	}
}

// TestEncodeRefusesOffsetsThatWrap: a section whose offsets reach
// the top of uint64 encodes (Next wraps to 0), and every decoder refuses the object;
// Stream.Put would ship it and a flusher acknowledge it.
func TestEncodeRefusesOffsetsThatWrap(t *testing.T) {
	h := Header{Instance: "i-1", Sequence: 0, Writer: "w"}
	data, err := Encode(h, []Section{{Shard: "a", First: math.MaxUint64, Records: records(1, "r")}})
	if err != nil {
		return // refused: fine
	}
	if _, _, _, err := Decode(data); err != nil {
		t.Fatalf("Encode wrote what Decode refuses: %v", err)
	}
}
