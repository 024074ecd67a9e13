package part

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const partName = "shards/s/parts/test"

// records returns n records of varied sizes, compressible like event payloads.
func records(n int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"event":%d,"kind":"order.created","body":%q}`, i, strings.Repeat("abcdefgh", 1+rng.IntN(300)))
	}
	return out
}

func encode(t testing.TB, shard string, first uint64, recs [][]byte, opts Options) ([]byte, Info) {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf, shard, first, opts)
	for _, r := range recs {
		if err := w.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	info, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(buf.Len()) {
		t.Fatalf("info says %d bytes, wrote %d", info.Size, buf.Len())
	}
	return buf.Bytes(), info
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r     *bytes.Reader
	bytes atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.bytes.Add(int64(n))
	return n, err
}

func readAll(r *Reader, from uint64) ([]Record, error) {
	var out []Record
	for rec, err := range r.Records(from) {
		if err != nil {
			return out, err
		}
		out = append(out, rec)
	}
	return out, nil
}

func TestPartsRoundTripFromEveryOffset(t *testing.T) {
	recs := records(700, 1)
	data, info := encode(t, "orders-7", 1000, recs, Options{BlockSize: 8 << 10})
	if info.Blocks < 10 || info.Count != 700 || info.First != 1000 {
		t.Fatalf("info %+v: want many small blocks", info)
	}
	r, err := Open(bytes.NewReader(data), int64(len(data)), partName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Info(); got != info {
		t.Fatalf("reader info %+v, writer info %+v", got, info)
	}
	for _, from := range []uint64{0, 1000, 1001, 1349, 1350, 1699, 1700, 5000} {
		got, err := readAll(r, from)
		if err != nil {
			t.Fatalf("from %d: %v", from, err)
		}
		skip := max(0, min(int(from)-1000, len(recs)))
		if len(got) != len(recs)-skip {
			t.Fatalf("from %d: %d records, want %d", from, len(got), len(recs)-skip)
		}
		for i, rec := range got {
			if rec.Offset != uint64(1000+skip+i) || !bytes.Equal(rec.Value, recs[skip+i]) {
				t.Fatalf("from %d: record %d is offset %d, wrong bytes", from, i, rec.Offset)
			}
		}
	}
	if err := r.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestAMidPartReadDecodesOnlyTheBlocksItNeeds(t *testing.T) {
	recs := records(2000, 2)
	data, info := encode(t, "s", 0, recs, Options{})
	c := &countingReaderAt{r: bytes.NewReader(data)}
	r, err := Open(c, int64(len(data)), partName, nil)
	if err != nil {
		t.Fatal(err)
	}
	opened := c.bytes.Load()
	got, err := readAll(r, info.Count-1)
	if err != nil || len(got) != 1 {
		t.Fatalf("last record: %d records, %v", len(got), err)
	}
	last := r.index[len(r.index)-1]
	if read := c.bytes.Load() - opened; read != int64(last.stored) {
		t.Fatalf("reading the last record read %d bytes, its block is %d", read, last.stored)
	}
	if info.Blocks < 4 {
		t.Fatalf("%d blocks: too few to tell", info.Blocks)
	}
}

// TestEveryFlippedByteIsReported flips each byte of a part in turn: opening it and
// reading it whole must fail; no flip may change a record silently.
func TestEveryFlippedByteIsReported(t *testing.T) {
	recs := records(60, 3)
	data, _ := encode(t, "s", 5, recs, Options{BlockSize: 2 << 10})
	for pos := range data {
		damaged := bytes.Clone(data)
		damaged[pos] ^= 0x20
		r, err := Open(bytes.NewReader(damaged), int64(len(damaged)), partName, nil)
		if err == nil {
			_, err = readAll(r, 0)
		}
		var ce *CorruptionError
		if !errors.As(err, &ce) && !errors.Is(err, ErrUnknownVersion) {
			t.Fatalf("byte %d flipped: %v, want a CorruptionError", pos, err)
		}
		if ce != nil && ce.Part != partName {
			t.Fatalf("byte %d: error names %q", pos, ce.Part)
		}
	}
}

func TestATruncatedPartIsCorrupt(t *testing.T) {
	data, _ := encode(t, "s", 0, records(50, 4), Options{BlockSize: 1 << 10})
	for _, n := range []int{0, 1, headerLen, len(data) / 2, len(data) - 1} {
		if _, err := Open(bytes.NewReader(data[:n]), int64(n), partName, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d of %d bytes: %v, want ErrCorrupt", n, len(data), err)
		}
	}
}

func TestAFutureVersionIsRefusedAsSuch(t *testing.T) {
	data, _ := encode(t, "s", 0, records(3, 5), Options{})
	data[len(headerMagic)] = version + 1
	if _, err := Open(bytes.NewReader(data), int64(len(data)), partName, nil); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("open: %v, want ErrUnknownVersion", err)
	}
}

func TestAnEmptyPartIsRefused(t *testing.T) {
	if _, err := NewWriter(&bytes.Buffer{}, "s", 0, Options{}).Close(); err == nil {
		t.Fatal("a part without records was written")
	}
}

func TestTheWriterRefusesAnEmptyRecord(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, "s", 0, Options{})
	for _, rec := range [][]byte{[]byte("a"), nil, {}, []byte("b")} {
		if err := w.Add(rec); (len(rec) == 0) != errors.Is(err, ErrEmptyRecord) {
			t.Fatalf("add %q: %v", rec, err)
		}
	}
	// Refusing a record leaves the part as it was.
	info, err := w.Close()
	if err != nil || info.Count != 2 {
		t.Fatalf("close: %+v, %v", info, err)
	}
	if err := openAndVerify(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// FuzzOpenAndRead: no input makes the reader panic or return a record after an
// error; valid parts are seeds.
func FuzzOpenAndRead(f *testing.F) {
	for i, n := range []int{1, 5, 40} {
		data, _ := encode(f, "s", uint64(i*100), records(n, uint64(i)), Options{BlockSize: 1 << 10})
		f.Add(data, uint64(i*100+n/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, from uint64) {
		r, err := Open(bytes.NewReader(data), int64(len(data)), partName, nil)
		if err != nil {
			return
		}
		for _, err := range r.Records(from) {
			if err != nil {
				return
			}
		}
	})
}
