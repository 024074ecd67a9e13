package tail

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
)

func sample() (Header, []Section) {
	h := Header{Instance: "i-0b7f", Incarnation: 3, Sequence: 41, Writer: "w-1234"}
	var ss []Section
	for s := range 5 {
		var recs [][]byte
		for r := range 3 + s {
			recs = append(recs, []byte(fmt.Sprintf("shard %d record %d %s", s, r, bytes.Repeat([]byte{'x'}, 10*r))))
		}
		ss = append(ss, Section{Shard: fmt.Sprint("orders-", s), Epoch: uint64(7 + s), First: uint64(100 * s), Records: recs})
	}
	return h, ss
}

// countingReader counts the reads a reader of one shard makes.
type countingReader struct {
	*bytes.Reader
	reads int
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	return c.Reader.ReadAt(p, off)
}

func TestAnObjectReadsBackWholeAndOneShardAtATime(t *testing.T) {
	h, ss := sample()
	data, err := Encode(h, ss)
	if err != nil {
		t.Fatal(err)
	}
	gh, ix, sections, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if gh != h || ix.Sequence != h.Sequence || ix.Incarnation != h.Incarnation || len(sections) != len(ss) {
		t.Fatalf("header %+v, index %+v, %d sections", gh, ix, len(sections))
	}
	for i, s := range ss {
		if !slices.EqualFunc(sections[i], s.Records, bytes.Equal) {
			t.Fatalf("section %d differs", i)
		}
	}
	// One shard: the trailer, the index, then its section only.
	r := &countingReader{Reader: bytes.NewReader(data)}
	ix, err = ReadIndex(r, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	e, ok := ix.Find("orders-3")
	if !ok || e.Epoch != 10 || e.First != 300 || e.Next != 306 {
		t.Fatalf("entry %+v %v", e, ok)
	}
	recs, err := ReadSection(r, e)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(recs, ss[3].Records, bytes.Equal) || r.reads != 3 {
		t.Fatalf("%d records in %d reads", len(recs), r.reads)
	}
}

// TestEveryFlippedByteIsCaught: the header, the sections, the index and the trailer
// are each checksummed, so a change of any byte is an error, never other records.
func TestEveryFlippedByteIsCaught(t *testing.T) {
	h, ss := sample()
	data, err := Encode(h, ss)
	if err != nil {
		t.Fatal(err)
	}
	for i := range data {
		bad := slices.Clone(data)
		bad[i] ^= 0x20
		if _, _, _, err := Decode(bad); err == nil {
			t.Fatalf("flipping byte %d of %d went unnoticed", i, len(data))
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d: %v is not a corruption", i, err)
		}
	}
	for n := range len(data) {
		if _, _, _, err := Decode(data[:n]); err == nil {
			t.Fatalf("an object cut to %d of %d bytes decoded", n, len(data))
		}
	}
}

func TestAZeroByteObjectIsAFence(t *testing.T) {
	if _, err := ReadIndex(bytes.NewReader(nil), 0); !errors.Is(err, ErrFence) {
		t.Fatalf("ReadIndex: %v", err)
	}
	if _, _, _, err := Decode(nil); !errors.Is(err, ErrFence) {
		t.Fatalf("Decode: %v", err)
	}
}

func TestEncodeRefusesWhatNoReaderCouldTrust(t *testing.T) {
	h, ss := sample()
	for name, c := range map[string]struct {
		h  Header
		ss []Section
	}{
		"no instance":     {Header{}, ss},
		"a shard twice":   {h, []Section{ss[0], ss[0]}},
		"an empty record": {h, []Section{{Shard: "a", Records: [][]byte{{}}}}},
		"no records":      {h, []Section{{Shard: "a"}}},
		"no shard id":     {h, []Section{{Records: [][]byte{{1}}}}},
		"a long shard id": {h, []Section{{Shard: string(make([]byte, MaxID+1)), Records: [][]byte{{1}}}}},
	} {
		if _, err := Encode(c.h, c.ss); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// An object with no section is a flush of nothing: valid, if never written.
	data, err := Encode(h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ix, _, err := Decode(data); err != nil || len(ix.Entries) != 0 {
		t.Fatalf("%+v %v", ix, err)
	}
}

func TestKeysOfAStreamSortBySequence(t *testing.T) {
	var keys []string
	for _, seq := range []uint64{10, 9, 100, 0, 1 << 40} {
		keys = append(keys, Key("i-1", 2, seq))
	}
	sort.Strings(keys)
	want := []string{Key("i-1", 2, 0), Key("i-1", 2, 9), Key("i-1", 2, 10), Key("i-1", 2, 100), Key("i-1", 2, 1<<40)}
	if !slices.Equal(keys, want) {
		t.Fatalf("%v", keys)
	}
}

// FuzzDecode: no input panics or allocates beyond its size, and whatever decodes
// encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	h, ss := sample()
	data, _ := Encode(h, ss)
	f.Add(data)
	one, _ := Encode(h, ss[:1])
	f.Add(one)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, ix, sections, err := Decode(data)
		if err != nil {
			return
		}
		ss := make([]Section, len(ix.Entries))
		for i, e := range ix.Entries {
			ss[i] = Section{Shard: e.Shard, Epoch: e.Epoch, First: e.First, Records: sections[i]}
		}
		again, err := Encode(h, ss)
		if err != nil {
			t.Fatalf("decoded but does not encode: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("decoded %d bytes, encode back to %d other bytes", len(data), len(again))
		}
	})
}
