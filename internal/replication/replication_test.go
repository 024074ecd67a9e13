package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func bucket(t *testing.T, name string, d substrate.Driver) *substrate.Bucket {
	return substratetest.NewBucket(t, name, d)
}

// spec is a replica.Spec, its fields in order.
func spec(name, domain string, b *substrate.Bucket) replica.Spec {
	return replica.Spec{Name: name, Domain: domain, Bucket: b}
}

func TestNewSetValidates(t *testing.T) {
	a, b := bucket(t, "a", nil), bucket(t, "b", nil)
	for name, tc := range map[string]struct {
		specs     []replica.Spec
		authority string
		ok        bool
	}{
		"one":               {[]replica.Spec{spec("a", "d1", a)}, "", true},
		"two, named auth":   {[]replica.Spec{spec("a", "d1", a), spec("b", "d2", b)}, "b", true},
		"none":              {nil, "", false},
		"no bucket":         {[]replica.Spec{spec("a", "d1", nil)}, "", false},
		"no domain":         {[]replica.Spec{spec("a", "", a)}, "", false},
		"same name":         {[]replica.Spec{spec("a", "d1", a), spec("a", "d2", b)}, "", false},
		"bad name":          {[]replica.Spec{spec("a/../b", "d1", a)}, "", false},
		"unknown authority": {[]replica.Spec{spec("a", "d1", a)}, "z", false},
	} {
		s, err := NewSet(tc.specs, tc.authority)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidSet)) {
			t.Errorf("%s: %v", name, err)
		}
		if err == nil && tc.authority != "" && s.Authority().Name != tc.authority {
			t.Errorf("%s: authority %s", name, s.Authority().Name)
		}
	}
}

// TestDurabilityComesFromThePartsNotTheConfiguration: a two-domain set whose history
// is single-copy reads as configured for domain loss and not survivable as data.
func TestDurabilityComesFromThePartsNotTheConfiguration(t *testing.T) {
	s, err := NewSet([]replica.Spec{spec("local", "node-a", bucket(t, "local", nil)), spec("gcs", "gcp", bucket(t, "gcs", nil))}, "")
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c.Size != 2 || c.DistinctDomains != 2 || c.SinglePointOfFailure {
		t.Fatalf("config %+v", c)
	}
	parts := []PartReplicas{{"p1", []string{"local"}}, {"p2", []string{"local"}}, {"p3", []string{"local", "gcs"}}}
	d := s.Assess(parts, func(key string) bool { return key == "p2" })
	if d.UnderReplicated != 2 || d.Stuck != 1 || d.SurvivesDomainLoss {
		t.Fatalf("durability %+v: want 2 under-replicated, 1 stuck (p1), not survivable", d)
	}
	if d := s.Assess(parts[2:], nil); d.UnderReplicated != 0 || !d.SurvivesDomainLoss {
		t.Fatalf("a fully replicated part: %+v", d)
	}
	one, _ := NewSet([]replica.Spec{spec("a", "x", bucket(t, "a", nil)), spec("b", "x", bucket(t, "b", nil))}, "")
	if c := one.Config(); !c.SinglePointOfFailure || c.DistinctDomains != 1 {
		t.Fatalf("two replicas in one domain: %+v", c)
	}
}

// TestSurvivalIsClaimedFromPartsOnly: no part known is no evidence of survival,
// and a set of one domain never survives its loss, whatever its parts' copies.
func TestSurvivalIsClaimedFromPartsOnly(t *testing.T) {
	two, err := NewSet([]replica.Spec{spec("a", "d1", bucket(t, "a", nil)), spec("b", "d2", bucket(t, "b", nil))}, "")
	if err != nil {
		t.Fatal(err)
	}
	one, err := NewSet([]replica.Spec{spec("a", "d1", bucket(t, "a1", nil)), spec("b", "d1", bucket(t, "b1", nil))}, "")
	if err != nil {
		t.Fatal(err)
	}
	both := []PartReplicas{{"p1", []string{"a", "b"}}, {"p2", []string{"a", "b"}}}
	for _, tc := range []struct {
		name  string
		set   *Set
		parts []PartReplicas
		want  bool
	}{
		{"two domains, no part known", two, nil, false},
		{"two domains, no part known (empty)", two, []PartReplicas{}, false},
		{"one domain, no part known", one, nil, false},
		{"one domain, every part on every replica", one, both, false},
		{"two domains, every part on both", two, both, true},
		{"two domains, one part on one", two, append(both[:1:1], PartReplicas{"p3", []string{"a"}}), false},
	} {
		d := tc.set.Assess(tc.parts, nil)
		if d.SurvivesDomainLoss != tc.want || d.Parts != len(tc.parts) {
			t.Errorf("%s: SurvivesDomainLoss = %v with %d parts, want %v", tc.name, d.SurvivesDomainLoss, d.Parts, tc.want)
		}
	}
}

// writePart writes a real part file and returns its path and info.
func writePart(t *testing.T, n int) (string, part.Info) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.part")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := part.NewWriter(f, "s", 0, part.Options{})
	for i := range n {
		w.Add(fmt.Appendf(nil, "record %d %s", i, bytes.Repeat([]byte("z"), 200)))
	}
	info, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	return path, info
}

// partBytes is writePart's part as bytes, to be put on a replica.
func partBytes(t *testing.T, n int) ([]byte, part.Info) {
	t.Helper()
	path, info := writePart(t, n)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data, info
}

type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) AddReplica(_ context.Context, key, replica string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, key+"@"+replica)
	return nil
}

// recordFunc is a Recorder made of a function.
type recordFunc func(ctx context.Context, key, replica string) error

func (f recordFunc) AddReplica(ctx context.Context, key, replica string) error {
	return f(ctx, key, replica)
}

func setOf(t *testing.T, names ...string) (*Set, map[string]*substrate.Bucket) {
	t.Helper()
	var specs []replica.Spec
	buckets := map[string]*substrate.Bucket{}
	for i, n := range names {
		b := bucket(t, n, nil)
		buckets[n] = b
		specs = append(specs, spec(n, fmt.Sprint("domain-", i), b))
	}
	s, err := NewSet(specs, "")
	if err != nil {
		t.Fatal(err)
	}
	return s, buckets
}

func TestAnUploadCopiesALocalPartToEveryTargetAndRecordsEach(t *testing.T) {
	ctx := context.Background()
	s, buckets := setOf(t, "a", "b", "c")
	path, info := writePart(t, 100)
	rec := &recorder{}
	u := NewUploader(s, replica.Options{}, nil, nil)
	defer u.Close()
	sealed := time.Now().Add(-time.Second)
	j := Job{Shard: "s", Key: "k1", Size: info.Size, CRC: info.CRC, Source: FromFile(path), Targets: []string{"b", "c"}, SealedAt: sealed, Recorder: rec}
	if err := u.Enqueue(j); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "c"} {
		if a, err := buckets[n].Attributes(ctx, "k1"); err != nil || a.Size != info.Size {
			t.Fatalf("%s: %v %+v", n, err, a)
		}
	}
	st := u.Stats()
	if st.Uploads != 2 || st.UploadBytes != 2*uint64(info.Size) || st.DurableParts != 1 || st.UploadLagMicrosTotal < 1e6 || st.BackfillUploads != 0 {
		t.Fatalf("stats %+v", st)
	}
	if len(rec.seen) != 2 || u.Pending("k1") {
		t.Fatalf("recorded %v, pending %v", rec.seen, u.Pending("k1"))
	}
}

// TestABackfillReadsFromAReplicaAndAddsNoLagSample: no local file, no seal time.
func TestABackfillReadsFromAReplicaAndAddsNoLagSample(t *testing.T) {
	ctx := context.Background()
	s, buckets := setOf(t, "a", "b")
	data, info := partBytes(t, 50)
	buckets["a"].PutBytes(ctx, "k", data)
	rec := &recorder{}
	u := NewUploader(s, replica.Options{TempDir: t.TempDir()}, nil, nil)
	defer u.Close()
	u.Enqueue(Job{Shard: "s", Key: "k", Size: info.Size, CRC: info.CRC, Source: FromReplica("a", "k"), Targets: []string{"b"}, Recorder: rec})
	u.Flush(ctx)
	got, _, err := buckets["b"].Get(ctx, "k")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the backfilled copy: %v", err)
	}
	st := u.Stats()
	if st.BackfillUploads != 1 || st.BackfillUploadBytes != uint64(info.Size) || st.Uploads != 0 || st.UploadLagMicrosTotal != 0 || st.DurableParts != 0 {
		t.Fatalf("stats %+v: a backfill must not count as an upload or add lag", st)
	}
}

func TestACorruptSourceIsNotCopied(t *testing.T) {
	ctx := context.Background()
	s, buckets := setOf(t, "a", "b")
	data, info := partBytes(t, 50)
	data[len(data)/3] ^= 1
	buckets["a"].PutBytes(ctx, "k", data)
	u := NewUploader(s, replica.Options{TempDir: t.TempDir(), Attempts: 2, BackoffMin: time.Millisecond}, nil, nil)
	defer u.Close()
	u.Enqueue(Job{Key: "k", Size: info.Size, CRC: info.CRC, Source: FromReplica("a", "k"), Targets: []string{"b"}, Recorder: &recorder{}})
	u.Flush(ctx)
	if _, err := buckets["b"].Attributes(ctx, "k"); !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("a damaged part was copied: %v", err)
	}
	if st := u.Stats(); st.UploadFailures != 1 || st.BackfillUploads != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAnObjectAlreadyThereIsRecordedAgain: a re-driven upload re-states the copy.
func TestAnObjectAlreadyThereIsRecordedAgain(t *testing.T) {
	ctx := context.Background()
	s, buckets := setOf(t, "a", "b")
	path, info := writePart(t, 20)
	data, _ := os.ReadFile(path)
	buckets["b"].PutBytes(ctx, "k", data)
	rec := &recorder{}
	u := NewUploader(s, replica.Options{}, nil, nil)
	defer u.Close()
	u.Enqueue(Job{Key: "k", Size: info.Size, CRC: info.CRC, Source: FromFile(path), Targets: []string{"b"}, Recorder: rec})
	u.Flush(ctx)
	if len(rec.seen) != 1 {
		t.Fatalf("recorded %v: a copy already there must be recorded", rec.seen)
	}
}

func TestAFailedUploadIsCountedAndReleasesFlush(t *testing.T) {
	ctx := context.Background()
	fd := fault.Wrap(mem.New(), 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Err: errors.New("down")})
	a := bucket(t, "a", nil)
	b := bucket(t, "b", fd)
	s, _ := NewSet([]replica.Spec{spec("a", "d1", a), spec("b", "d2", b)}, "")
	path, info := writePart(t, 20)
	rec := &recorder{}
	u := NewUploader(s, replica.Options{Attempts: 3, BackoffMin: time.Millisecond}, nil, nil)
	defer u.Close()
	u.Enqueue(Job{Key: "k", Size: info.Size, CRC: info.CRC, Source: FromFile(path), Targets: []string{"b"}, SealedAt: time.Now(), Recorder: rec})
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := u.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if st := u.Stats(); st.UploadFailures != 1 || st.Uploads != 0 || st.DurableParts != 0 || fd.Injected() != 3 {
		t.Fatalf("stats %+v after %d injected failures; want 1 failure after 3 attempts", st, fd.Injected())
	}
	if len(rec.seen) != 0 || u.Pending("k") {
		t.Fatal("a failed upload was recorded or is still pending")
	}
}

// TestABackfillRecordsItsCopiesTogether: the records of a shard's backfill copies
// wait for the last of them, so that the manifest is published once or twice and not
// between copies.
func TestABackfillRecordsItsCopiesTogether(t *testing.T) {
	ctx := context.Background()
	s, buckets := setOf(t, "a", "b")
	data, info := partBytes(t, 50)
	const parts = 8
	var u *Uploader
	var mu sync.Mutex
	var copiedAtRecord []uint64
	record := recordFunc(func(_ context.Context, key, replica string) error {
		mu.Lock()
		defer mu.Unlock()
		copiedAtRecord = append(copiedAtRecord, u.Stats().BackfillUploads)
		return nil
	})
	u = NewUploader(s, replica.Options{Workers: 2, TempDir: t.TempDir(), BackfillRecordDelay: time.Minute}, nil, nil)
	defer u.Close()
	var jobs []Job
	for i := range parts {
		key := fmt.Sprint("k", i)
		buckets["a"].PutBytes(ctx, key, data)
		jobs = append(jobs, Job{Shard: "s", Key: key, Size: info.Size, CRC: info.CRC, Source: FromReplica("a", key), Targets: []string{"b"}, Recorder: record})
	}
	if err := u.Enqueue(jobs...); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(copiedAtRecord) != parts {
		t.Fatalf("%d records, want %d", len(copiedAtRecord), parts)
	}
	for i, n := range copiedAtRecord {
		if n != parts {
			t.Fatalf("record %d made when %d of %d copies were done: %v", i, n, parts, copiedAtRecord)
		}
	}
}

// TestABackfillRecordWaitsNoLongerThanItsDelay: a copy is recorded after
// BackfillRecordDelay even while another copy of its shard is still running.
func TestABackfillRecordWaitsNoLongerThanItsDelay(t *testing.T) {
	ctx := context.Background()
	const slowPut = 3 * time.Second
	a := bucket(t, "a", nil)
	b := bucket(t, "b", fault.Wrap(mem.New(), 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^slow$", Latency: slowPut}))
	s, err := NewSet([]replica.Spec{spec("a", "d0", a), spec("b", "d1", b)}, "")
	if err != nil {
		t.Fatal(err)
	}
	data, info := partBytes(t, 50)
	var mu sync.Mutex
	recorded := map[string]time.Duration{}
	start := time.Now()
	record := recordFunc(func(_ context.Context, key, replica string) error {
		mu.Lock()
		defer mu.Unlock()
		recorded[key] = time.Since(start)
		return nil
	})
	u := NewUploader(s, replica.Options{Workers: 2, TempDir: t.TempDir(), BackfillRecordDelay: 100 * time.Millisecond}, nil, nil)
	defer u.Close()
	var jobs []Job
	for _, key := range []string{"slow", "fast"} {
		a.PutBytes(ctx, key, data)
		jobs = append(jobs, Job{Shard: "s", Key: key, Size: info.Size, CRC: info.CRC, Source: FromReplica("a", key), Targets: []string{"b"}, Recorder: record})
	}
	if err := u.Enqueue(jobs...); err != nil {
		t.Fatal(err)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(recorded) != 2 || recorded["slow"] < slowPut {
		t.Fatalf("recorded %v", recorded)
	}
	// Generous: the delay is 100 ms, the slow copy takes 3 s.
	if recorded["fast"] > slowPut-time.Second {
		t.Fatalf("the fast copy was recorded after %v, waiting for the slow one (%v)", recorded["fast"], recorded["slow"])
	}
}

// TestAnUploadToAReplicaThatNeverAnswersFailsAfterItsAttempts: every attempt has
// a timeout, so a black-holed replica fails the job instead of holding it (and
// whatever waits for it) until the uploader closes.
func TestAnUploadToAReplicaThatNeverAnswersFailsAfterItsAttempts(t *testing.T) {
	ctx := context.Background()
	fd := fault.Wrap(mem.New(), 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Latency: time.Hour})
	s, _ := NewSet([]replica.Spec{spec("a", "d1", bucket(t, "a", nil)), spec("b", "d2", bucket(t, "b", fd))}, "")
	path, info := writePart(t, 20)
	u := NewUploader(s, replica.Options{Attempts: 2, BackoffMin: time.Millisecond, AttemptTimeout: 50 * time.Millisecond}, nil, nil)
	defer u.Close()
	u.Enqueue(Job{Key: "k", Size: info.Size, CRC: info.CRC, Source: FromFile(path), Targets: []string{"b"}, SealedAt: time.Now(), Recorder: &recorder{}})
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := u.Flush(fctx); err != nil {
		t.Fatalf("the job is still held by a replica that never answers: %v", err)
	}
	if st := u.Stats(); st.UploadFailures != 1 {
		t.Fatalf("stats %+v, want the job failed", st)
	}
}
