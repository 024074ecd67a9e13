package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"slices"
	"testing"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

func cmd(s *testStore, name string, args ...string) []string {
	return append(append([]string{name}, s.flags()...), args...)
}

func TestTheCommandsDescribeAHealthyStore(t *testing.T) {
	s := sealedStore(t, true)
	code, out, _ := l0ctl(t, cmd(s, "verify")...)
	if code != 0 {
		t.Fatalf("verify of a healthy store: exit %d", code)
	}
	contains(t, "verify", out, "s1: ok", "s2: ok", "s3: ok", "verified 3 shards (18 part copies read): no damage")

	code, out, _ = l0ctl(t, cmd(s, "shards")...)
	if code != 0 {
		t.Fatalf("shards: exit %d", code)
	}
	contains(t, "shards", out, "SHARD", "s1  15      3      1      writer  released")

	code, out, _ = l0ctl(t, cmd(s, "manifest", "s2")...)
	if code != 0 {
		t.Fatalf("manifest: exit %d", code)
	}
	contains(t, "manifest", out, "REPLICA  local", "state    authority  in step", "sealed   15")

	code, out, _ = l0ctl(t, cmd(s, "parts", "s3")...)
	if code != 0 {
		t.Fatalf("parts: exit %d", code)
	}
	contains(t, "parts", out, "0      5     5        1      ", "local,gcs  shards/s3/parts/00000000000000000010-00000000000000000015-e1-")

	code, out, _ = l0ctl(t, cmd(s, "parts", "-json", "s3")...)
	var parts []partRow
	if err := json.Unmarshal([]byte(out), &parts); code != 0 || err != nil || len(parts) != 3 || parts[2].Next != 15 || parts[2].Copies["gcs"] != "ok" {
		t.Fatalf("parts -json: exit %d, %v: %+v", code, err, parts)
	}

	code, out, _ = l0ctl(t, cmd(s, "tail", "s1")...)
	if code != 0 {
		t.Fatalf("tail: exit %d", code)
	}
	contains(t, "tail", out, "tail: none")

	code, out, _ = l0ctl(t, cmd(s, "leases")...)
	if code != 0 {
		t.Fatalf("leases: exit %d", code)
	}
	contains(t, "leases", out, "writer    released")
	code, out, _ = l0ctl(t, cmd(s, "lease", "writer")...)
	if code != 0 {
		t.Fatalf("lease: exit %d", code)
	}
	contains(t, "lease", out, "state       released", "shards owned under it: none")
}

func TestUsageErrorsExitWith2(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		nil,
		{"nonsense"},
		{"shards"},
		{"shards", "-replica", "a=ftp://x"},
		{"shards", "-replica", "a=dir://" + dir, "-authority", "b"},
		{"manifest", "-replica", "a=dir://" + dir},
		{"manifest", "-replica", "a=dir://" + dir, "s1", "s2"},
		{"verify", "-replica", "a=dir://" + dir, "-nonsense"},
	} {
		if code, _, _ := l0ctl(t, args...); code != 2 {
			t.Errorf("l0ctl %q: exit %d, want 2", args, code)
		}
	}
	code, out, _ := l0ctl(t, "verify", "-h")
	if code != 0 {
		t.Errorf("verify -h: exit %d, want 0", code)
	}
	contains(t, "verify -h", out, "usage: l0ctl verify", "-replica NAME=URL", "STORAGE_EMULATOR_HOST")
	if code, _, errOut := l0ctl(t, "shards", "-replica", "a=dir://"+dir+"/missing"); code != 1 {
		t.Errorf("shards on a directory that is not there: exit %d, want 1: %s", code, errOut)
	}
	// Flags after the arguments are flags too.
	if code, _, _ := l0ctl(t, "tail", "s1", "-replica", "a=dir://"+dir); code != 1 {
		t.Errorf("tail of a shard with no manifest: exit %d, want 1", code)
	}
}

// damage is one kind of damage planted in a store, and what verify must say of it.
type damage struct {
	name  string
	plant func(t *testing.T, s *testStore)
	want  []string
}

func TestVerifyNamesEachDamage(t *testing.T) {
	ctx := context.Background()
	for _, d := range []damage{{
		name: "a part's bytes corrupted on one replica",
		plant: func(t *testing.T, s *testStore) {
			p := partOf(t, s, "s2", 1)
			rewrite(t, s.gcs, p.Key, func(b []byte) { b[20] ^= 0xff }) // in the first block
		},
		want: []string{"s2: DAMAGE: part 5 to 10 on gcs:", "block 0 checksum", "s1: ok", "s3: ok"},
	}, {
		name: "a part missing on a replica",
		plant: func(t *testing.T, s *testStore) {
			if err := s.local.Delete(ctx, partOf(t, s, "s1", 2).Key); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{"s1: DAMAGE: part 10 to 15 on local: missing"},
	}, {
		name: "a part whose checksum frame is broken",
		plant: func(t *testing.T, s *testStore) {
			p := partOf(t, s, "s3", 0)
			rewrite(t, s.local, p.Key, func(b []byte) { b[len(b)-44+33] ^= 0x01 }) // the footer's own CRC
		},
		want: []string{"s3: DAMAGE: part 0 to 5 on local:", "footer checksum"},
	}, {
		name: "a manifest whose parts start past offset 0",
		plant: func(t *testing.T, s *testStore) {
			m := load(t, s.local, "s1")
			m.Parts, m.Seq = m.Parts[1:], m.Seq+1
			data, err := manifest.Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			put(t, s.local, manifest.Key("s1"), data)
		},
		want: []string{"s1: DAMAGE: the manifest on local: its first part starts at 5: offsets 0 to 4 are in no part"},
	}, {
		name: "a manifest with a gap between its parts",
		plant: func(t *testing.T, s *testStore) {
			// The manifest's encoder refuses a gap: the bytes are laid out here.
			m := load(t, s.local, "s2")
			m.Parts = slices.Delete(m.Parts, 1, 2)
			body, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			b := append([]byte("l0man\x01"), body...)
			b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
			put(t, s.local, manifest.Key("s2"), b)
		},
		want: []string{"s2: DAMAGE: the manifest on the authority local:", "part 1 starts at 10, after 5"},
	}, {
		name: "a copy's manifest diverged",
		plant: func(t *testing.T, s *testStore) {
			// A cold open from the GCS replica alone, as an authority of its
			// own, that forgot where it took the history over.
			m := load(t, s.gcs, "s3")
			m.Authority, m.Fork, m.Epoch, m.Seq, m.Owner, m.Released = "gcs", nil, m.Epoch+1, 1, "rogue", false
			data, err := manifest.Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			put(t, s.gcs, manifest.Key("s3"), data)
		},
		want: []string{"s3: DAMAGE: the manifest on gcs is diverged:", `"rogue"'s epoch 2 seq 1 of authority "gcs"`},
	}} {
		t.Run(d.name, func(t *testing.T) {
			s := sealedStore(t, true)
			d.plant(t, s)
			code, out, _ := l0ctl(t, cmd(s, "verify")...)
			if code != 1 {
				t.Errorf("verify: exit %d, want 1", code)
			}
			contains(t, "verify", out, d.want...)
			contains(t, "verify", out, "1 damaged")
		})
	}
}

func TestVerifyReadsAnS3Replica(t *testing.T) {
	s := newStore(t, false)
	s.s3, s.s3Name = s3Bucket(t)
	writeSealed(t, s)
	code, out, _ := l0ctl(t, cmd(s, "verify")...)
	if code != 0 {
		t.Fatalf("verify of a healthy store on a directory and S3: exit %d", code)
	}
	contains(t, "verify", out, "verified 3 shards (18 part copies read): no damage")
	rewrite(t, s.s3, partOf(t, s, "s1", 2).Key, func(b []byte) { b[len(b)/2] ^= 0x10 })
	code, out, _ = l0ctl(t, cmd(s, "verify", "s1")...)
	if code != 1 {
		t.Errorf("verify with a part corrupted on S3: exit %d, want 1", code)
	}
	contains(t, "verify", out, "s1: DAMAGE: part 10 to 15 on s3:", "verified 1 shards (6 part copies read): 1 damaged")
}

func TestVerifyFindsATailObjectAShardNeedsMissing(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, true)
	// Remote durability: every record acknowledged is in the tail. The engine
	// closes with the shard open: it retires the shard, unsealed, and its
	// manifest points at the tail for the records past the sealed watermark.
	opts := s.options(t, "writer")
	opts.Durability = engine.Remote
	e, err := engine.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := e.OpenShard(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, sh, 5, "sealed")
	if _, err := sh.Seal(ctx, 1<<30); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		appendN(t, sh, 4, "unsealed-"+string(rune('a'+i)))
	}
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	code, out, _ := l0ctl(t, cmd(s, "verify")...)
	if code != 0 {
		t.Fatalf("verify with the tail whole: exit %d", code)
	}
	contains(t, "verify", out, "t1: ok")
	code, out, _ = l0ctl(t, cmd(s, "tail", "t1")...)
	if code != 0 {
		t.Fatalf("tail: exit %d", code)
	}
	contains(t, "tail", out, "released with a backlog", "records past the sealed watermark in the tail: 12 (offsets 5 to 16)")

	m := load(t, s.local, "t1")
	if m.Tail == nil || !m.Backlog {
		t.Fatalf("the manifest after the engine closed: %+v, want a backlog in the tail", m)
	}
	if m.Tail.Until < m.Tail.From+2 || m.Tail.UntilIncarnation != 0 {
		t.Fatalf("the tail pointer %+v: want three objects, one an append, in one incarnation", m.Tail)
	}
	// An object in the middle of the stream, then the first one the pointer
	// needs: a stream is written in order and collected from its start, so the
	// first is a gap, and the second reads as collected; either way the
	// records it held are not there.
	for _, c := range []struct {
		seq  uint64
		want []string
	}{
		{m.Tail.From + 1, []string{"t1: DAMAGE: tail: incarnation 1 of writer on local: sequences missing: " + fmt.Sprint(m.Tail.From+1), "not found"}},
		{m.Tail.From, []string{"t1: DAMAGE: tail: reading the records past the sealed watermark 5:", "records missing", "the records from 5 are not there"}},
	} {
		if err := s.local.Delete(ctx, tail.Key(m.Tail.Instance, m.Tail.Incarnation, c.seq)); err != nil {
			t.Fatal(err)
		}
		code, out, _ = l0ctl(t, cmd(s, "verify")...)
		if code != 1 {
			t.Errorf("verify with tail object %d gone: exit %d, want 1", c.seq, code)
		}
		contains(t, "verify", out, c.want...)
	}
}

// partOf returns the i-th part of shard id, as the authority's manifest names it.
func partOf(t *testing.T, s *testStore, id string, i int) manifest.Part {
	t.Helper()
	return load(t, s.local, id).Parts[i]
}

func load(t *testing.T, b *substrate.Bucket, id string) manifest.Manifest {
	t.Helper()
	m, err := manifest.LoadFrom(context.Background(), b, id)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func put(t *testing.T, b *substrate.Bucket, key string, data []byte) {
	t.Helper()
	if _, err := b.PutBytes(context.Background(), key, data); err != nil {
		t.Fatal(err)
	}
}

// rewrite changes the object under key in place.
func rewrite(t *testing.T, b *substrate.Bucket, key string, change func([]byte)) {
	t.Helper()
	data, _, err := b.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	change(data)
	put(t, b, key, data)
}
