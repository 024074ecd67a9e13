package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// fuzzSeeds are valid encodings of varied manifests: empty, leased, released with a
// backlog, forked, with parts on several replicas, with a tail pointer.
func fuzzSeeds(f *testing.F) [][]byte {
	at := time.Date(2025, 3, 1, 12, 30, 0, 123456789, time.UTC)
	ms := []Manifest{
		{},
		{Shard: "s"},
		{Shard: "s", Epoch: 3, Seq: 9, Owner: "i1", LeaseExpiry: at, Sealed: 30, Parts: []Part{part(0, 10), part(10, 20)}},
		{Shard: "orders-7", Epoch: 1 << 40, Seq: 1<<64 - 1, Authority: "gcs", Fork: &Fork{Authority: "s3", Epoch: 4, Seq: 17},
			Owner: "i2", LeaseExpiry: at.In(time.FixedZone("", -7*3600)), Released: true, Backlog: true, Sealed: 1 << 50,
			Parts: []Part{{Key: "k/ü", First: 1<<50 - 5, Count: 5, Size: -1, CRC: 1<<32 - 1, SealedAt: at, Epoch: 2,
				Replicas: []string{"gcs", "s3", "local"}}},
			Tail: &Tail{Replica: "gcs", Instance: "i2", Incarnation: 5, From: 11, Until: 99}},
		{Shard: "t", Epoch: 2, Fork: &Fork{}, Sealed: 7, Parts: []Part{{Key: "p", First: 2, Count: 5, Replicas: []string{}}},
			Tail: &Tail{Replica: "a", Instance: "b"}},
		{Shard: "\x00\"\\<\u2028", Parts: []Part{}, Tail: &Tail{}},
	}
	seeds := make([][]byte, len(ms))
	for i, m := range ms {
		b, err := Encode(m)
		if err != nil {
			f.Fatalf("seed %d: %v", i, err)
		}
		seeds[i] = b
	}
	return seeds
}

// checkDecode holds Decode's result for data to what a decoder of durable bytes
// owes: an error that says the manifest is corrupt (or of an unknown version), or a
// manifest that satisfies the invariants and encodes back to itself.
func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	m, err := Decode(data)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownVersion) {
			t.Fatalf("decode: %v, want ErrCorrupt or ErrUnknownVersion", err)
		}
		// Decode refuses a well-framed manifest only for its body: as JSON, or as
		// Validate judges it.
		if len(data) >= len(magic)+1+4 && len(data) <= MaxSize && string(data[:len(magic)]) == magic && data[len(magic)] == version && resealed(data) {
			var raw Manifest
			if json.Unmarshal(data[len(magic)+1:len(data)-4], &raw) == nil {
				if verr := raw.Validate(); verr == nil || verr.Error() != err.Error() {
					t.Fatalf("decode: %v; the body parses, and Validate says %v", err, verr)
				}
			}
		}
		return
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("decoded a manifest that fails Validate: %v", err)
	}
	if err := inOrder(m); err != nil {
		t.Fatalf("decoded %+v: %v", m, err)
	}
	again, err := Encode(m)
	if err != nil {
		t.Fatalf("decoded but does not encode: %v", err)
	}
	back, err := Decode(again)
	if err != nil {
		t.Fatalf("decoded, encoded, and the encoding does not decode: %v", err)
	}
	if !reflect.DeepEqual(inUTC(back), inUTC(m)) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, m)
	}
	if twice, err := Encode(back); err != nil || !bytes.Equal(twice, again) {
		t.Fatalf("encoding is not a fixed point: %v\n%q\n%q", err, twice, again)
	}
}

// inOrder checks Validate's invariants without its uint64 arithmetic: each part
// non-empty and ending where the next starts, in offset order, the last at Sealed.
func inOrder(m Manifest) error {
	next := uint64(0)
	for i, p := range m.Parts {
		switch {
		case p.Count == 0:
			return errors.New("an empty part")
		case i > 0 && p.First != next:
			return errors.New("a gap between parts")
		case p.First+p.Count < p.First:
			return errors.New("a part past the largest offset")
		}
		next = p.First + p.Count
	}
	if len(m.Parts) > 0 && next != m.Sealed {
		return errors.New("parts do not end at the sealed watermark")
	}
	return nil
}

// resealed reports whether data's checksum is that of its body.
func resealed(data []byte) bool {
	d := bytes.Clone(data)
	putCRC(d)
	return bytes.Equal(d, data)
}

// inUTC returns a deep copy of m with its times in UTC: a time's location is not
// part of the manifest's value (a zero lease expiry is omitted whatever its zone).
func inUTC(m Manifest) Manifest {
	m = m.Clone()
	m.LeaseExpiry = m.LeaseExpiry.UTC()
	for i := range m.Parts {
		m.Parts[i].SealedAt = m.Parts[i].SealedAt.UTC()
	}
	return m
}

// FuzzDecode: no input makes Decode panic or fail with other than ErrCorrupt or
// ErrUnknownVersion; what decodes satisfies Validate and encodes back to a manifest
// that decodes to it. Each input is decoded also with its checksum recomputed, so
// the fuzzer reaches the JSON and Validate behind it; refusing a well-framed input
// whose body parses is then Validate's verdict, word for word.
func FuzzDecode(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
		if len(data) >= 4 {
			data = bytes.Clone(data)
			putCRC(data)
			checkDecode(t, data)
		}
	})
}

// FuzzDamagedManifest damages a valid encoding: it keeps the first keep bytes, XORs
// the byte at at with flip, and with reseal recomputes the checksum over what is
// left. Decode must refuse the result or return a valid manifest, as FuzzDecode
// checks; a single damaged byte under the original checksum it must refuse.
func FuzzDamagedManifest(f *testing.F) {
	seeds := fuzzSeeds(f)
	for i, b := range seeds {
		f.Add(uint8(i), uint32(len(b)/2), byte(0x04), uint32(len(b)), false)
		f.Add(uint8(i), uint32(len(magic)+1), byte('1'^'2'), uint32(len(b)), true)
		f.Add(uint8(i), uint32(len(b)-6), byte(0x20), uint32(len(b)-5), true)
	}
	f.Fuzz(func(t *testing.T, which uint8, at uint32, flip byte, keep uint32, reseal bool) {
		data := bytes.Clone(seeds[int(which)%len(seeds)])
		truncated := int64(keep) < int64(len(data))
		if truncated {
			data = data[:keep]
		}
		if len(data) > 0 {
			data[int(at)%len(data)] ^= flip
		}
		if reseal && len(data) >= 4 {
			putCRC(data)
		}
		if !reseal && !truncated && flip != 0 {
			// CRC-32C detects every error burst of up to 32 bits.
			if m, err := Decode(data); err == nil {
				t.Fatalf("byte %d XORed with %#x under the old checksum decodes: %+v", int(at)%len(data), flip, m)
			}
		}
		checkDecode(t, data)
	})
}

// TestAPartPastTheLargestOffsetIsRefused: a part whose records would run past the
// largest offset wraps around, so it cannot be in offset order; Validate refuses
// it, and so Encode and Decode do.
func TestAPartPastTheLargestOffsetIsRefused(t *testing.T) {
	m := Manifest{Shard: "s", Sealed: 1, Parts: []Part{{Key: "k", First: 1<<64 - 1, Count: 2}}}
	if err := m.Validate(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Validate: %v, want ErrCorrupt", err)
	}
	if _, err := Encode(m); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Encode: %v, want ErrCorrupt", err)
	}
}
