package engine

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/substratetest"
)

// history is a store whose shard "s" sealed 3 parts on a local replica alone; the
// GCS replica is then attached by opening with both.
type history struct {
	dir        string
	local, gcs *substrate.Bucket
	gcsFault   *fault.Driver
	records    [][]byte
	parts      []string
}

func newHistory(t *testing.T) *history {
	t.Helper()
	h := &history{dir: t.TempDir()}
	h.local, _ = newBucket(t, backends[0])
	h.gcs, h.gcsFault = newBucket(t, backends[1])
	e := open(t, h.options(false))
	sh := openShard(t, e, "s")
	for range 3 {
		h.records = append(h.records, appendBatches(t, sh, 2)...)
		if _, err := sh.Seal(context.Background(), 1<<30); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range sh.Manifest().Parts {
		h.parts = append(h.parts, p.Key)
	}
	if err := sh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return h
}

// options are the engine's: the local replica, and with attached the GCS one too.
func (h *history) options(attached bool) Options {
	specs := []replica.Spec{{Name: "local", Domain: "node-a", Bucket: h.local}}
	if attached {
		specs = append(specs, replica.Spec{Name: "gcs", Domain: "gcp", Bucket: h.gcs})
	}
	return Options{Dir: h.dir, Replicas: specs, Authority: "local", Seal: quietSealOptions(),
		Upload: replica.Options{BackoffMin: 5 * time.Millisecond, Attempts: 3}}
}

// attach opens the engine with both replicas and the shard.
func (h *history) attach(t *testing.T) (*Engine, *shard.Shard) {
	t.Helper()
	e := open(t, h.options(true))
	return e, openShard(t, e, "s")
}

func flush(t *testing.T, e *Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.FlushAndWaitUploads(ctx); err != nil {
		t.Fatal(err)
	}
}

// requireReplicas fails the test unless the manifest names n replicas for every part
// of sh.
func requireReplicas(t *testing.T, sh *shard.Shard, n int) {
	t.Helper()
	for _, p := range sh.Manifest().Parts {
		if len(p.Replicas) != n {
			t.Fatalf("part %s on %v, want %d replicas", p.Key, p.Replicas, n)
		}
	}
}

// coldRead opens a new engine, in a new directory, on bucket alone, and reads shard
// "s" whole.
func coldRead(t *testing.T, b *substrate.Bucket, name string) ([][]byte, error) {
	t.Helper()
	e := open(t, Options{Dir: t.TempDir(), Replicas: []replica.Spec{{Name: name, Domain: "cold", Bucket: b}}, Seal: quietSealOptions()})
	defer e.Close()
	sh, err := e.OpenShard(context.Background(), "s")
	if err != nil {
		return nil, err
	}
	var got [][]byte
	for rec, err := range sh.Read(context.Background(), 0) {
		if err != nil {
			return got, err
		}
		got = append(got, rec.Value)
	}
	return got, nil
}

// TestAttachingAReplicaLeavesEveryExistingPartShortForever states the defect that
// backfill repairs: copying at seal alone never reaches history. Keep it.
func TestAttachingAReplicaLeavesEveryExistingPartShortForever(t *testing.T) {
	h := newHistory(t)
	e, sh := h.attach(t)
	flush(t, e)
	for _, p := range sh.Manifest().Parts {
		if !slices.Equal(p.Replicas, []string{"local"}) {
			t.Fatalf("part %s names %v without a backfill", p.Key, p.Replicas)
		}
	}
	if m := e.Metrics(); m.Uploads != 0 || m.BackfillUploads != 0 {
		t.Fatalf("uploads %d, backfill uploads %d", m.Uploads, m.BackfillUploads)
	}
	if n := substratetest.CountObjects(t, h.gcs, manifest.PartsPrefix("s")); n != 0 {
		t.Fatalf("the attached replica holds %d parts", n)
	}
	if d := e.Metrics().Data; d.UnderReplicated != 3 || d.Stuck != 3 {
		t.Fatalf("data durability %+v: 3 parts short and stuck", d)
	}
}

func TestBackfillReplicatesHistoryAndTheNewReplicaAloneCanServeIt(t *testing.T) {
	h := newHistory(t)
	e, sh := h.attach(t)
	n, err := e.BackfillUnderReplicated(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("backfill queued %d parts (%v), want 3", n, err)
	}
	flush(t, e)
	for _, p := range sh.Manifest().Parts {
		if !slices.Equal(p.Replicas, []string{"local", "gcs"}) {
			t.Fatalf("part %s names %v after the backfill", p.Key, p.Replicas)
		}
	}
	m := e.Metrics()
	if m.BackfillUploads != 3 || m.BackfillUploadBytes == 0 || m.Uploads != 0 || m.UploadLagMicrosTotal != 0 {
		t.Fatalf("backfill %d / %d bytes, uploads %d, lag %d µs: want 3, >0, 0, 0",
			m.BackfillUploads, m.BackfillUploadBytes, m.Uploads, m.UploadLagMicrosTotal)
	}
	if !m.Data.SurvivesDomainLoss || m.Data.UnderReplicated != 0 {
		t.Fatalf("data durability after the backfill: %+v", m.Data)
	}
	if err := sh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.Close()
	got, err := coldRead(t, h.gcs, "gcs")
	if err != nil || !equal(got, h.records) {
		t.Fatalf("cold read from the new replica alone: %d records of %d, %v", len(got), len(h.records), err)
	}
}

func TestASingleReplicaSetBackfillsNothing(t *testing.T) {
	h := newHistory(t)
	e := open(t, h.options(false))
	openShard(t, e, "s")
	puts := h.local.Stats().Total(substrate.OpPutIfAbsent)
	if n, err := e.BackfillUnderReplicated(context.Background()); n != 0 || err != nil {
		t.Fatalf("backfill of a single-replica set: %d, %v", n, err)
	}
	flush(t, e)
	if got := h.local.Stats().Total(substrate.OpPutIfAbsent) - puts; got != 0 {
		t.Fatalf("%d puts", got)
	}
}

func TestBackfillIsIdempotentAndNeverDropsALocation(t *testing.T) {
	ctx := context.Background()
	h := newHistory(t)
	// One part is already on the new replica, unrecorded (a copy whose record was
	// lost): the backfill must state it, not rewrite it.
	data, _, err := h.local.Get(ctx, h.parts[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.gcs.PutBytes(ctx, h.parts[0], data); err != nil {
		t.Fatal(err)
	}
	e, sh := h.attach(t)
	for round, want := range []int{3, 0} {
		n, err := e.BackfillUnderReplicated(ctx)
		if err != nil || n != want {
			t.Fatalf("backfill %d queued %d (%v), want %d", round, n, err, want)
		}
		flush(t, e)
		for _, p := range sh.Manifest().Parts {
			if !slices.Equal(p.Replicas, []string{"local", "gcs"}) {
				t.Fatalf("after backfill %d part %s names %v", round, p.Key, p.Replicas)
			}
		}
	}
	if substratetest.CountObjects(t, h.gcs, manifest.PartsPrefix("s")) != 3 {
		t.Fatalf("%d objects on the new replica", substratetest.CountObjects(t, h.gcs, manifest.PartsPrefix("s")))
	}
	// The counters say what the backfill wrote: two copies, not the one it found.
	var size uint64
	for _, p := range sh.Manifest().Parts[1:] {
		size += uint64(p.Size)
	}
	if m := e.Metrics(); m.BackfillUploads != 2 || m.BackfillUploadBytes != size {
		t.Fatalf("backfill uploads %d, %d bytes; want the 2 copies written, %d bytes", m.BackfillUploads, m.BackfillUploadBytes, size)
	}
}

func TestBackfillAfterRestartReadsFromAReplica(t *testing.T) {
	h := newHistory(t)
	// A restart: nothing in this process sealed the parts, and no part file is left.
	files, _ := filepath.Glob(filepath.Join(h.dir, "parts", "*"))
	for _, f := range files {
		os.Remove(f)
	}
	e, sh := h.attach(t)
	gets := h.local.Stats().Total(substrate.OpGet)
	n, err := e.BackfillUnderReplicated(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("backfill after restart: %d, %v", n, err)
	}
	flush(t, e)
	if got := h.local.Stats().Total(substrate.OpGet) - gets; got < 3 {
		t.Fatalf("%d reads from the local replica for 3 copies: the parts were not read back from it", got)
	}
	if m := e.Metrics(); m.BackfillUploads != 3 || m.UploadFailures != 0 {
		t.Fatalf("backfill uploads %d, failures %d", m.BackfillUploads, m.UploadFailures)
	}
	requireReplicas(t, sh, 2)
}

// TestReplayRefusesHistoryWithAnUnreachablePart: before a backfill, the attached
// replica has a manifest naming every part and the bytes of none: a cold open from
// it succeeds, and its replay fails naming a part, with no partial history.
func TestReplayRefusesHistoryWithAnUnreachablePart(t *testing.T) {
	h := newHistory(t)
	e, sh := h.attach(t)
	if err := sh.Close(context.Background()); err != nil { // publishes the manifest to both
		t.Fatal(err)
	}
	e.Close()
	got, err := coldRead(t, h.gcs, "gcs")
	if err == nil || !errors.Is(err, shard.ErrNoReachableReplica) || !strings.Contains(err.Error(), h.parts[0]) {
		t.Fatalf("replay from the attached replica alone: %v, want no reachable replica for %s", err, h.parts[0])
	}
	if len(got) != 0 {
		t.Fatalf("%d records returned before the failure: a partial history", len(got))
	}
}

func TestDurabilityGaugesComeFromTheParts(t *testing.T) {
	h := newHistory(t)
	e, _ := h.attach(t)
	m := e.Metrics()
	if m.Config.Size != 2 || m.Config.DistinctDomains != 2 || m.Config.SinglePointOfFailure {
		t.Fatalf("configuration %+v", m.Config)
	}
	if m.Data.SurvivesDomainLoss || m.Data.UnderReplicated != 3 || m.Data.Parts != 3 {
		t.Fatalf("data %+v: single-copy history must not read as survivable", m.Data)
	}
}

func TestAFailedUploadIsRepairedByALaterBackfill(t *testing.T) {
	ctx := context.Background()
	h := newHistory(t)
	e, sh := h.attach(t)
	h.gcsFault.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/parts/", Err: errors.New("injected: gcs down")})
	more := appendBatches(t, sh, 2)
	if _, err := sh.Seal(ctx, 1<<30); err != nil {
		t.Fatal(err)
	}
	flush(t, e)
	if m := e.Metrics(); m.UploadFailures != 1 || m.Uploads != 0 {
		t.Fatalf("failures %d, uploads %d: want the new part's upload failed", m.UploadFailures, m.Uploads)
	}
	h.gcsFault.SetRules()
	if n, err := e.BackfillUnderReplicated(ctx); err != nil || n != 4 {
		t.Fatalf("backfill: %d, %v; want the 3 old parts and the failed one", n, err)
	}
	flush(t, e)
	if d := e.Metrics().Data; d.UnderReplicated != 0 || !d.SurvivesDomainLoss {
		t.Fatalf("after the backfill: %+v", d)
	}
	sh.Close(ctx)
	e.Close()
	got, err := coldRead(t, h.gcs, "gcs")
	if err != nil || !equal(got, append(h.records, more...)) {
		t.Fatalf("cold read: %d records, %v", len(got), err)
	}
}

func TestBackfillOnOpenCopiesTheShardsHistory(t *testing.T) {
	h := newHistory(t)
	opts := h.options(true)
	opts.BackfillOnOpen = true
	e := open(t, opts)
	sh := openShard(t, e, "s")
	flush(t, e)
	if m := e.Metrics(); m.BackfillUploads != 3 || m.Data.UnderReplicated != 0 {
		t.Fatalf("backfill uploads %d, data %+v", m.BackfillUploads, m.Data)
	}
	requireReplicas(t, sh, 2)
}

// TestWithoutBackfillAnOpenWarnsOnceThatTheReplicasAreNotACopy: with backfill off and
// parts short, the operator is told, once, what the healthy-looking gauges do not say.
func TestWithoutBackfillAnOpenWarnsOnceThatTheReplicasAreNotACopy(t *testing.T) {
	h := newHistory(t)
	var logs strings.Builder
	opts := h.options(true)
	opts.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e := open(t, opts)
	openShard(t, e, "s")
	openShard(t, e, "t") // an empty shard: nothing to say
	if n := strings.Count(logs.String(), "not a recoverable copy"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "BackfillOnOpen") {
		t.Fatalf("the warning does not say how to turn backfill on:\n%s", logs.String())
	}
}

// TestAReadFallsBackToTheNextReplicaOnCorruption: a part damaged on the first replica
// is read from the second; damaged on both, the read fails naming it.
func TestAReadFallsBackToTheNextReplicaOnCorruption(t *testing.T) {
	ctx := context.Background()
	h := newHistory(t)
	e, sh := h.attach(t)
	if _, err := e.BackfillUnderReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	flush(t, e)
	damage := func(b *substrate.Bucket, key string) {
		data, _, err := b.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0x40
		if _, err := b.PutBytes(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	damage(h.local, h.parts[1])
	if got := readAll(t, sh, 0); !equal(got, h.records) {
		t.Fatalf("%d records of %d with the first replica's copy damaged", len(got), len(h.records))
	}
	damage(h.gcs, h.parts[1])
	var err error
	for _, err = range sh.Read(ctx, 0) {
		if err != nil {
			break
		}
	}
	if !errors.Is(err, shard.ErrNoReachableReplica) || !strings.Contains(err.Error(), h.parts[1]) {
		t.Fatalf("both copies damaged: %v", err)
	}
}
