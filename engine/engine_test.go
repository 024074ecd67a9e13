package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { stopGCS() }))
}

// buckets holds one in-memory bucket per engine directory, so that reopening a
// directory finds the manifests it published.
var buckets sync.Map

func bucketFor(t testing.TB, dir string) *substrate.Bucket {
	if b, ok := buckets.Load(dir); ok {
		return b.(*substrate.Bucket)
	}
	b, err := substrate.New(mem.New(), substrate.Options{Name: "mem"})
	if err != nil {
		t.Fatal(err)
	}
	buckets.Store(dir, b)
	return b
}

// open opens an engine on opts, with the directory's bucket unless opts has one.
func open(t *testing.T, opts Options) *Engine {
	t.Helper()
	if opts.Bucket == nil && len(opts.Replicas) == 0 && opts.Dir != "" {
		opts.Bucket = bucketFor(t, opts.Dir)
	}
	e, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func openShard(t *testing.T, e *Engine, id string) *shard.Shard {
	t.Helper()
	sh, err := e.OpenShard(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sh
}

func recs(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, "%s-%d", prefix, i)
	}
	return out
}

// readAll reads sh from offset from and checks that offsets are dense.
func readAll(t *testing.T, sh *shard.Shard, from uint64) [][]byte {
	t.Helper()
	var out [][]byte
	for rec, err := range sh.Read(context.Background(), from) {
		if err != nil {
			t.Fatalf("read %s from %d: %v", sh.ID(), from, err)
		}
		if want := from + uint64(len(out)); rec.Offset != want {
			t.Fatalf("read %s: offset %d, want %d", sh.ID(), rec.Offset, want)
		}
		out = append(out, rec.Value)
	}
	return out
}

func equal(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestOffsetsAreDenseAndContinueAcrossReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var want [][]byte
	for session := range 3 {
		e := open(t, Options{Dir: dir})
		sh := openShard(t, e, "orders-7")
		for batch := range 4 {
			rs := recs(fmt.Sprintf("s%d-b%d", session, batch), batch+1)
			first, err := sh.Append(ctx, rs...)
			if err != nil {
				t.Fatal(err)
			}
			if first != uint64(len(want)) {
				t.Fatalf("session %d batch %d: first offset %d, want %d", session, batch, first, len(want))
			}
			want = append(want, rs...)
		}
		for from := range uint64(len(want) + 1) {
			if got := readAll(t, sh, from); !equal(got, want[from:]) {
				t.Fatalf("session %d: read from %d: %d records, want %d", session, from, len(got), len(want[from:]))
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestShardsAreIndependent(t *testing.T) {
	ctx := context.Background()
	e := open(t, Options{Dir: t.TempDir()})
	a, b := openShard(t, e, "a"), openShard(t, e, "a.b")
	for i := range 5 {
		if first, err := a.Append(ctx, recs("a", 2)...); err != nil || first != uint64(2*i) {
			t.Fatalf("a: first %d, %v", first, err)
		}
	}
	if first, err := b.Append(ctx, []byte("b")); err != nil || first != 0 {
		t.Fatalf("b: first %d, %v; a shard's offsets must not depend on another's", first, err)
	}
	if got := readAll(t, b, 0); len(got) != 1 {
		t.Fatalf("b has %d records, want 1", len(got))
	}
}

func TestShardIDs(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir()})
	valid := []string{"a", "orders-7", "A.b_c-9", "..a", strings.Repeat("x", 128)}
	invalid := []string{"", ".", "..", "a/b", "a b", "a\x00b", "ü", "a:b", strings.Repeat("x", 129)}
	for _, id := range valid {
		sh, err := e.OpenShard(context.Background(), id)
		if err != nil {
			t.Errorf("OpenShard(%q): %v", id, err)
			continue
		}
		sh.Close(context.Background())
	}
	for _, id := range invalid {
		if _, err := e.OpenShard(context.Background(), id); !errors.Is(err, shard.ErrInvalidID) {
			t.Errorf("OpenShard(%q): %v, want ErrInvalidID", id, err)
		}
	}
}

func TestOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		opts  Options
		valid bool
	}{
		"defaults":              {Options{Dir: "d"}, true},
		"no dir":                {Options{}, false},
		"negative record size":  {Options{Dir: "d", MaxRecordSize: -1}, false},
		"record over batch":     {Options{Dir: "d", MaxRecordSize: 2 << 20, MaxBatchBytes: 1 << 20}, false},
		"batch over the limit":  {Options{Dir: "d", MaxBatchBytes: MaxBatchBytesLimit + 1}, false},
		"record sets the batch": {Options{Dir: "d", MaxRecordSize: 8 << 20}, true},
		"small limits":          {Options{Dir: "d", MaxRecordSize: 1, MaxBatchBytes: 1}, true},
		"batch at the limit":    {Options{Dir: "d", MaxBatchBytes: MaxBatchBytesLimit}, true},
	} {
		t.Run(name, func(t *testing.T) {
			o := tc.opts
			o.Bucket = bucketFor(t, "options")
			o.EnsureDefaults()
			err := o.Validate()
			if tc.valid != (err == nil) || err != nil && !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("Validate: %v, want valid=%v", err, tc.valid)
			}
		})
	}
}

func TestBadInputGetsATypedErrorAndWritesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	e := open(t, Options{Dir: dir, MaxRecordSize: 100, MaxBatchBytes: 250})
	sh := openShard(t, e, "s")
	if _, err := sh.Append(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	for name, tc := range badAppends(ctx) {
		t.Run(name, func(t *testing.T) {
			if _, err := sh.Append(tc.ctx, tc.recs...); !errors.Is(err, tc.want) {
				t.Fatalf("Append: %v, want %v", err, tc.want)
			}
			if next := sh.Info().Next; next != 1 {
				t.Fatalf("next offset %d after a refused append, want 1", next)
			}
		})
	}
	// At the limits exactly, the batch is taken.
	if first, err := sh.Append(ctx, make([]byte, 100), make([]byte, 100), make([]byte, 50)); err != nil || first != 1 {
		t.Fatalf("batch at the limits: first %d, %v", first, err)
	}
	m := e.Metrics()
	if m.AppendErrors[reasonInvalid] != 4 || m.AppendErrors[reasonCanceled] != 1 || m.Appends != 2 {
		t.Fatalf("metrics: %d appends, errors %v; want 2 appends, 4 invalid and 1 canceled", m.Appends, m.AppendErrors)
	}

	if err := sh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Append(ctx, []byte("after")); !errors.Is(err, shard.ErrClosed) {
		t.Fatalf("append after Close: %v, want shard.ErrClosed", err)
	}
	for _, err := range sh.Read(ctx, 0) {
		if !errors.Is(err, shard.ErrClosed) {
			t.Fatalf("read after Close: %v, want shard.ErrClosed", err)
		}
	}
	if err := sh.Close(context.Background()); !errors.Is(err, shard.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.OpenShard(ctx, "s"); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenShard after Close: %v, want ErrClosed", err)
	}
	if err := e.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}

	e = open(t, Options{Dir: dir})
	if got := readAll(t, openShard(t, e, "s"), 0); len(got) != 4 || string(got[0]) != "before" {
		t.Fatalf("after reopen: %d records, want the 4 accepted", len(got))
	}
}

func TestAShardIsOpenOnceAtATime(t *testing.T) {
	ctx := context.Background()
	e := open(t, Options{Dir: t.TempDir()})
	sh := openShard(t, e, "s")
	if _, err := e.OpenShard(ctx, "s"); !errors.Is(err, ErrShardOpen) {
		t.Fatalf("second OpenShard: %v, want ErrShardOpen", err)
	}
	sh.Close(context.Background())
	openShard(t, e, "s")
}

func TestEngineCloseClosesItsShards(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir()})
	sh := openShard(t, e, "s")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Append(context.Background(), []byte("x")); !errors.Is(err, shard.ErrClosed) {
		t.Fatalf("append after the engine closed: %v, want shard.ErrClosed", err)
	}
}

func TestASecondEngineOnTheSameDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	open(t, Options{Dir: dir})
	if e, err := Open(context.Background(), Options{Dir: dir, Bucket: bucketFor(t, dir)}); err == nil {
		e.Close()
		t.Fatal("a second engine opened the same Dir")
	}
}

// TestConcurrentAppendsAreOrderedPerShardAndShareFsyncs appends from several
// goroutines to several shards: each shard's offsets are dense, each goroutine's
// batches land in the order it made them, and the WAL needed fewer fsyncs than there
// were appends.
func TestConcurrentAppendsAreOrderedPerShardAndShareFsyncs(t *testing.T) {
	ctx := context.Background()
	e := open(t, Options{Dir: t.TempDir()})
	const shards, writers, batches = 8, 4, 25
	type ack struct {
		first uint64
		recs  [][]byte
	}
	acks := make([][][]ack, shards)
	handles := make([]*shard.Shard, shards)
	var wg sync.WaitGroup
	for s := range shards {
		sh := openShard(t, e, fmt.Sprintf("s%d", s))
		handles[s] = sh
		acks[s] = make([][]ack, writers)
		for w := range writers {
			wg.Go(func() {
				for b := range batches {
					rs := recs(fmt.Sprintf("w%d-b%d", w, b), 1+b%3)
					first, err := sh.Append(ctx, rs...)
					if err != nil {
						t.Error(err)
						return
					}
					acks[s][w] = append(acks[s][w], ack{first, rs})
				}
			})
		}
	}
	wg.Wait()
	m := e.Metrics()
	for s, sh := range handles {
		got := readAll(t, sh, 0)
		total := 0
		for w := range writers {
			for i, a := range acks[s][w] {
				if i > 0 && a.first <= acks[s][w][i-1].first {
					t.Fatalf("%s writer %d: batch %d at %d, before its predecessor at %d", sh.ID(), w, i, a.first, acks[s][w][i-1].first)
				}
				if end := a.first + uint64(len(a.recs)); end > uint64(len(got)) || !equal(got[a.first:end], a.recs) {
					t.Fatalf("%s writer %d: batch %d is not at its offset %d", sh.ID(), w, i, a.first)
				}
				total += len(a.recs)
			}
		}
		if total != len(got) {
			t.Fatalf("%s holds %d records, %d were acknowledged", sh.ID(), len(got), total)
		}
		if m.Shards[sh.ID()].UnsealedBytes == 0 {
			t.Fatalf("%s: no unsealed bytes reported", sh.ID())
		}
	}
	if m.Appends != shards*writers*batches {
		t.Fatalf("%d appends counted, want %d", m.Appends, shards*writers*batches)
	}
	if m.WALFsyncs >= m.Appends {
		t.Fatalf("%d fsyncs for %d concurrent appends: no group commit", m.WALFsyncs, m.Appends)
	}
	t.Logf("%d appends, %d fsyncs", m.Appends, m.WALFsyncs)
}

// replicated returns the options of an engine on a new Dir whose replicas are a,
// its authority, and b, in two domains.
func replicated(t *testing.T, a, b *substrate.Bucket) Options {
	return Options{Dir: t.TempDir(), Replicas: []replica.Spec{
		{Name: "a", Domain: "d1", Bucket: a}, {Name: "b", Domain: "d2", Bucket: b}},
		Authority: "a", Seal: quietSealOptions()}
}

// badAppend is an append a shard refuses, and the error it refuses it with.
type badAppend struct {
	ctx  context.Context
	recs [][]byte
	want error
}

// badAppends are the appends refused by a shard whose limits are 100 bytes a
// record and 250 a batch.
func badAppends(ctx context.Context) map[string]badAppend {
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	return map[string]badAppend{
		"empty batch":      {ctx, nil, shard.ErrEmptyBatch},
		"empty record":     {ctx, [][]byte{[]byte("x"), {}}, shard.ErrEmptyRecord},
		"record too large": {ctx, [][]byte{[]byte("x"), make([]byte, 101)}, shard.ErrRecordTooLarge},
		"batch too large":  {ctx, [][]byte{make([]byte, 100), make([]byte, 100), make([]byte, 51)}, shard.ErrBatchTooLarge},
		"canceled context": {canceled, [][]byte{[]byte("x")}, context.Canceled},
	}
}
