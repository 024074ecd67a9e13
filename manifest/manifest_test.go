package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func part(first, count uint64) Part {
	return Part{Key: PartKey("s", first, first+count, 1, fmt.Sprint(first)), First: first, Count: count, Size: 100, CRC: 7,
		SealedAt: time.Unix(1, 0).UTC(), Epoch: 1, Replicas: []string{"a"}}
}

func TestEncodingRoundTripsAndRefusesDamage(t *testing.T) {
	m := Manifest{Shard: "s", Epoch: 3, Owner: "i1", LeaseExpiry: time.Unix(100, 0).UTC(), Sealed: 30,
		Parts: []Part{part(0, 10), part(10, 20)}}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(m) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for i := range b {
		d := bytes.Clone(b)
		d[i] ^= 0x04
		if _, err := Decode(d); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownVersion) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	for n := range len(b) {
		if _, err := Decode(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
}

func TestAFutureVersionIsRefusedAsSuch(t *testing.T) {
	b, _ := Encode(Manifest{Shard: "s"})
	b[len(magic)] = version + 1
	body := b[:len(b)-4]
	b = append(body, 0, 0, 0, 0)
	putCRC(b)
	if _, err := Decode(b); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("decode: %v, want ErrUnknownVersion", err)
	}
}

func putCRC(b []byte) {
	c := crc32.Checksum(b[:len(b)-4], castagnoli)
	b[len(b)-4], b[len(b)-3], b[len(b)-2], b[len(b)-1] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
}

func TestAManifestWithAGapIsInvalid(t *testing.T) {
	for name, m := range map[string]Manifest{
		"gap":          {Shard: "s", Sealed: 31, Parts: []Part{part(0, 10), part(11, 20)}},
		"short sealed": {Shard: "s", Sealed: 5, Parts: []Part{part(0, 10)}},
		"empty part":   {Shard: "s", Sealed: 0, Parts: []Part{part(0, 0)}},
	} {
		if _, err := Encode(m); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func TestAPartKeyNamesItsEpoch(t *testing.T) {
	key := PartKey("s", 10, 20, 7, "a1b2")
	if e, ok := PartKeyEpoch("s", key); !ok || e != 7 {
		t.Fatalf("PartKeyEpoch(%q) = %d, %v", key, e, ok)
	}
	for _, bad := range []string{"shards/s/manifest", PartKey("t", 10, 20, 7, "n"), PartsPrefix("s") + "junk", PartKey("s", 20, 20, 7, "n")} {
		if _, ok := PartKeyEpoch("s", bad); ok {
			t.Errorf("PartKeyEpoch(%q) took it for a part key", bad)
		}
	}
}
