package engine

import (
	"google.golang.org/api/option"

	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/gcs"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/substratetest"
	"github.com/l0store/l0/wal"
)

// The lifecycle tests run against the local-directory substrate and against
// fake-gcs-server over HTTP (the binary, started once for the package).
var (
	gcsOnce   sync.Once
	gcsServer *emulator.GCS
	gcsErr    error
	gcsNames  atomic.Int64
)

// stopGCS is called by TestMain.
func stopGCS() {
	if gcsServer != nil {
		gcsServer.Stop()
	}
}

type backend struct {
	name      string
	newDriver func(t *testing.T) substrate.Driver
	// newPair returns two drivers of one new bucket, each with a client of its
	// own, as two machines have.
	newPair func(t *testing.T) (substrate.Driver, substrate.Driver)
}

var backends = []backend{
	{"local", func(t *testing.T) substrate.Driver {
		d, _ := localPair(t)
		return d
	}, localPair},
	{"gcs", func(t *testing.T) substrate.Driver {
		return gcsDriver(t, fmt.Sprintf("l0-engine-%d", gcsNames.Add(1)))
	}, gcsPair},
}

func localPair(t *testing.T) (substrate.Driver, substrate.Driver) {
	dir := t.TempDir()
	a, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// gcsDriver creates bucket name on the emulator, and a client of it.
func gcsDriver(t *testing.T, name string) substrate.Driver {
	gcsOnce.Do(func() { gcsServer, gcsErr = emulator.StartGCSProcess() })
	if gcsErr != nil {
		t.Fatal(gcsErr)
	}
	d, err := gcsServer.NewDriver(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// gcsPair is gcsDriver and a second client of the same bucket; the caller wraps
// both in buckets, which close them.
func gcsPair(t *testing.T) (substrate.Driver, substrate.Driver) {
	name := fmt.Sprintf("l0-engine-%d", gcsNames.Add(1))
	a := gcsDriver(t, name)
	b, err := gcs.Open(context.Background(), gcs.Config{Bucket: name, Endpoint: gcsServer.Endpoint,
		ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// forEachBackend runs f once per backend.
func forEachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

// newBucket wraps a driver of b in the fault injector and a Bucket.
func newBucket(t *testing.T, b backend) (*substrate.Bucket, *fault.Driver) {
	t.Helper()
	fd := fault.Wrap(b.newDriver(t), 1)
	return substratetest.NewBucket(t, b.name, fd), fd
}

// quietSealOptions never seal by size, WAL bytes or age on their own.
func quietSealOptions() seal.Options {
	return seal.Options{SizeBytes: 1 << 40, WALBytes: 1 << 40, Age: time.Hour, Interval: 20 * time.Millisecond}
}

// appendBatches appends n batches of 4 records to sh and returns the records.
func appendBatches(t *testing.T, sh *shard.Shard, n int) [][]byte {
	t.Helper()
	var all [][]byte
	for i := range n {
		rs := recs(fmt.Sprintf("%s-b%d", sh.ID(), i), 4)
		if _, err := sh.Append(context.Background(), rs...); err != nil {
			t.Fatal(err)
		}
		all = append(all, rs...)
	}
	return all
}

// sealed reports whether sh holds nothing unsealed and e counted n seals: a seal
// truncates the WAL before the scheduler counts it.
func sealed(e *Engine, sh *shard.Shard, n uint64) func() bool {
	return func() bool { return sh.Info().UnsealedBytes == 0 && counts(e).seals >= n }
}

// waitFor polls cond until it holds or the liveness bound passes.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > bound {
			t.Fatalf("%s: not within %s", what, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// leaveUnsealed appends 10 batches to shard id of an engine on opts, retires the
// shard (a lag move: nothing sealed) and closes the engine; it returns the records.
func leaveUnsealed(t *testing.T, opts Options, id string) [][]byte {
	t.Helper()
	e := open(t, opts)
	sh := openShard(t, e, id)
	want := appendBatches(t, sh, 10)
	if err := sh.Retire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

type sealCounts struct{ seals, empty, failures, objects uint64 }

func counts(e *Engine) sealCounts {
	m := e.Metrics()
	return sealCounts{m.Seals, m.EmptySeals, m.SealFailures, m.Objects}
}

// readBackFromParts checks that sh holds exactly want, all of it in parts.
func readBackFromParts(t *testing.T, sh *shard.Shard, want [][]byte) {
	t.Helper()
	if info := sh.Info(); info.Sealed != uint64(len(want)) || info.UnsealedBytes != 0 {
		t.Fatalf("sealed through %d with %d bytes unsealed, want %d records all sealed", info.Sealed, info.UnsealedBytes, len(want))
	}
	if got := readAll(t, sh, 0); !equal(got, want) {
		t.Fatalf("read back %d records, want the %d acknowledged", len(got), len(want))
	}
}

func TestAnOpenSealsThePagesTheEngineBeforeItLeftUnsealed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		bucket, _ := newBucket(t, b)
		opts := Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()}
		want := leaveUnsealed(t, opts, "orders-7")

		e := open(t, opts)
		sh := openShard(t, e, "orders-7")
		took := waitFor(t, 5*time.Second, "the inherited pages sealed", sealed(e, sh, 1))
		t.Logf("%s: inherited backlog sealed %s after the open", b.name, took)
		if c := counts(e); c != (sealCounts{seals: 1, objects: 1}) {
			t.Fatalf("counters %+v, want seals 1, empty 0, failures 0, objects 1", c)
		}
		readBackFromParts(t, sh, want)
	})
}

func TestAFailedInheritedSealIsRetriedAtItsBackoff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		bucket, fd := newBucket(t, b)
		opts := Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()}
		opts.Seal.BackoffMin = 500 * time.Millisecond
		want := leaveUnsealed(t, opts, "orders-7")

		fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "/parts/", Nth: 1, Err: errors.New("injected: object put failed")})
		putsBefore := bucket.Stats().Total(substrate.OpPutIfAbsent)
		e := open(t, opts)
		sh := openShard(t, e, "orders-7")
		took := waitFor(t, 3*time.Second, "the inherited pages sealed after a failed first seal", sealed(e, sh, 1))
		t.Logf("%s: sealed %s after the open, the first attempt having failed", b.name, took)
		if c := counts(e); c != (sealCounts{seals: 1, failures: 1, objects: 1}) {
			t.Fatalf("counters %+v, want seals 1, empty 0, failures 1, objects 1", c)
		}
		if took < opts.Seal.BackoffMin {
			t.Fatalf("retried after %s, before the %s backoff", took, opts.Seal.BackoffMin)
		}
		time.Sleep(200 * time.Millisecond)
		if puts := bucket.Stats().Total(substrate.OpPutIfAbsent) - putsBefore - e.Metrics().TailPuts; puts != 2 {
			t.Fatalf("%d part puts, want 2: the failed one and its retry", puts)
		}
		readBackFromParts(t, sh, want)
	})
}

func TestAnOpenWithNothingUnsealedSealsNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		dir := t.TempDir()
		bucket, _ := newBucket(t, b)
		opts := Options{Dir: dir, Bucket: bucket, Seal: quietSealOptions()}
		e := open(t, opts)
		sh := openShard(t, e, "orders-7")
		want := appendBatches(t, sh, 5)
		if err := sh.Close(ctx); err != nil { // cooperative: seals the tail
			t.Fatal(err)
		}
		e.Close()

		putsBefore := bucket.Stats().Total(substrate.OpPutIfAbsent)
		e = open(t, opts)
		sh = openShard(t, e, "orders-7")
		time.Sleep(time.Second)
		if c := counts(e); c != (sealCounts{}) {
			t.Fatalf("counters %+v a second after the open, want 0/0/0/0", c)
		}
		if puts := bucket.Stats().Total(substrate.OpPutIfAbsent) - putsBefore; puts != 0 {
			t.Fatalf("%d object puts after an open with nothing unsealed", puts)
		}
		readBackFromParts(t, sh, want)
	})
}

func TestAnEmptyShardNeverSeals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		bucket, _ := newBucket(t, b)
		opts := Options{Dir: t.TempDir(), Bucket: bucket, Seal: seal.Options{SizeBytes: 1, WALBytes: 1, Age: time.Nanosecond, Interval: 5 * time.Millisecond}}
		e := open(t, opts)
		openShard(t, e, "idle")
		putsBefore := bucket.Stats().Total(substrate.OpPutIfAbsent)
		time.Sleep(300 * time.Millisecond)
		if c := counts(e); c != (sealCounts{}) {
			t.Fatalf("counters %+v for a shard that never had a record", c)
		}
		if puts := bucket.Stats().Total(substrate.OpPutIfAbsent) - putsBefore; puts != 0 {
			t.Fatalf("%d object puts for an empty shard", puts)
		}
	})
}

func TestAgeTriggerRunsFromTheOldestUnsealedRecord(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		clk := testclock.New()
		bucket, _ := newBucket(t, b)
		opts := Options{Dir: t.TempDir(), Bucket: bucket, Clock: clk, Seal: quietSealOptions()}
		opts.Seal.Age = 10 * time.Minute
		opts.Lease.Duration = 48 * time.Hour // the clock jumps; the lease must not lapse
		e := open(t, opts)
		sh := openShard(t, e, "s")
		want := appendBatches(t, sh, 1)
		clk.Advance(6 * time.Minute)
		want = append(want, appendBatches(t, sh, 1)...) // newer records do not restart the age
		clk.Advance(3 * time.Minute)                    // oldest 9 min old: not yet
		time.Sleep(100 * time.Millisecond)
		if c := counts(e); c.seals != 0 {
			t.Fatalf("sealed when the oldest record was 9 min old: %+v", c)
		}
		clk.Advance(90 * time.Second) // oldest 10.5 min, newest 4.5 min
		waitFor(t, 5*time.Second, "the age seal", sealed(e, sh, 1))
		if c := counts(e); c != (sealCounts{seals: 1, objects: 1}) {
			t.Fatalf("counters %+v, want one seal", c)
		}
		readBackFromParts(t, sh, want)
	})
}

func TestABudgetCutSealRearmsTheDeferredFlag(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		bucket, _ := newBucket(t, b)
		opts := Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()}
		// 10 batches of 4 records of 25 bytes: 1000 bytes cross the size trigger once;
		// a budget of 200 bytes seals two batches at a time, and after the first seal
		// the 800 left are under the size trigger: only the re-armed flag seals them.
		opts.Seal.SizeBytes = 900
		opts.Seal.Budget = 200
		e := open(t, opts)
		sh := openShard(t, e, "s")
		e.sealer.Pause("s", true)
		var want [][]byte
		for i := range 10 {
			var rs [][]byte
			for j := range 4 {
				rs = append(rs, fmt.Appendf(nil, "%-25s", fmt.Sprint(i, "-", j)))
			}
			if _, err := sh.Append(context.Background(), rs...); err != nil {
				t.Fatal(err)
			}
			want = append(want, rs...)
		}
		e.sealer.Pause("s", false)
		waitFor(t, 5*time.Second, "every page sealed, seal after seal", sealed(e, sh, 5))
		if c := counts(e); c != (sealCounts{seals: 5, objects: 5}) {
			t.Fatalf("counters %+v: want 5 seals of two batches, one object each", c)
		}
		if parts := len(sh.Manifest().Parts); parts != 5 {
			t.Fatalf("%d parts for 5 seals", parts)
		}
		readBackFromParts(t, sh, want)
	})
}

// TestAFencedOwnerAcknowledgesNothing: two engines on separate directories share
// the authority bucket; the first owner's lease lapses by the second's clock (the
// first's stands still, so it neither renews nor sees its lease end) and the second
// takes the shard over. From then on the first acknowledges nothing and cannot
// commit a seal: the appends that meet the fence in the tail may be in its WAL
// (ErrOutcomeUnknown), and once it knows, every one is ErrFenced.
func TestAFencedOwnerAcknowledgesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		clk := testclock.New() // B's: A's stands still, so A never renews
		bucket, _ := newBucket(t, b)
		opts := Options{Bucket: bucket, Clock: testclock.New(), Seal: quietSealOptions()}
		opts.Dir = t.TempDir()
		ea := open(t, opts)
		opts.Dir, opts.Clock = t.TempDir(), clk
		eb := open(t, opts)

		a := openShard(t, ea, "orders-7")
		acked := appendBatches(t, a, 3)
		if _, err := eb.OpenShard(ctx, "orders-7"); !errors.Is(err, ErrOwned) {
			t.Fatalf("B opened a shard A holds: %v", err)
		}
		clk.Advance(ea.opts.Lease.Duration + ea.opts.Lease.SkewMargin + time.Second)
		bsh := openShard(t, eb, "orders-7")
		if bsh.Info().Epoch <= a.Info().Epoch {
			t.Fatalf("B's epoch %d does not follow A's %d", bsh.Info().Epoch, a.Info().Epoch)
		}

		// A learns of the fence when its tail's next put meets it, a flush interval
		// or more after B's takeover: it appends until then (a liveness bound, not
		// a count: under -race and a loaded machine 100 appends once took less
		// than that), and 20 more after.
		fenced := 0
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; fenced < 20; i++ {
			if fenced == 0 && time.Now().After(deadline) {
				t.Fatalf("no append through the fenced owner was ErrFenced in %d appends", i)
			}
			_, err := a.Append(ctx, []byte(fmt.Sprint("late ", i)))
			switch {
			case errors.Is(err, shard.ErrOutcomeUnknown) && fenced == 0:
			case errors.Is(err, ErrFenced):
				fenced++
			default:
				t.Fatalf("append %d through the fenced owner: %v, want ErrFenced", i, err)
			}
		}
		if _, err := a.Seal(ctx, 1<<20); !errors.Is(err, ErrFenced) {
			t.Fatalf("the fenced owner's late seal: %v, want ErrFenced", err)
		}
		m, _, err := ownership.NewStore(bucket).Load(ctx, "orders-7")
		if err != nil {
			t.Fatal(err)
		}
		if m.Owner != eb.Instance() || m.Epoch != bsh.Info().Epoch {
			t.Fatalf("manifest after the fenced seal: %+v", m)
		}
		for _, p := range m.Parts {
			if p.Epoch != bsh.Info().Epoch {
				t.Fatalf("part %s sealed at epoch %d, after B took epoch %d", p.Key, p.Epoch, bsh.Info().Epoch)
			}
		}
		if got := ea.Metrics().AppendErrors[reasonFenced]; got != uint64(fenced) {
			t.Fatalf("%d fenced appends counted, want %d", got, fenced)
		}
		// B took A's 12 acknowledged records from A's tail, and appends after them.
		if first, err := bsh.Append(ctx, []byte("b")); err != nil || first != uint64(len(acked)) {
			t.Fatalf("B's first append: %d, %v; want %d, after A's", first, err, len(acked))
		}
		if got := readAll(t, bsh, 0); !equal(got[:len(acked)], acked) {
			t.Fatalf("B reads %q, want A's %q first", got, acked)
		}
	})
}

// TestOwnershipHandoffMovesBacklogWithoutABA: within one engine a shard is retired
// while its seal is in flight and opened again; the old owner's late seal and late
// truncation cannot change the new owner's backlog. The new owner's sealer is paused
// while the old one cleans up, so it does not seal the backlog first.
func TestOwnershipHandoffMovesBacklogWithoutABA(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		bucket, fd := newBucket(t, b)
		e := open(t, Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()})
		old := openShard(t, e, "orders-7")
		want := appendBatches(t, old, 8)
		oldEpoch := old.Info().Epoch

		// The old owner's seal stalls at its object put.
		fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: regexp.QuoteMeta("/parts/"), Latency: 500 * time.Millisecond})
		lateSeal := make(chan error, 1)
		go func() {
			_, err := old.Seal(context.Background(), 1<<20)
			lateSeal <- err
		}()
		time.Sleep(100 * time.Millisecond) // the seal is in its put
		if err := old.Retire(ctx); err != nil {
			t.Fatal(err)
		}
		e.sealer.Pause("orders-7", true)
		sh := openShard(t, e, "orders-7")
		before := sh.Info()
		if before.UnsealedBytes == 0 || before.Next != uint64(len(want)) {
			t.Fatalf("the new owner did not inherit the backlog: %+v", before)
		}

		if err := <-lateSeal; !errors.Is(err, ErrFenced) {
			t.Fatalf("the old owner's late seal: %v, want ErrFenced", err)
		}
		if err := e.log.TruncateThrough("orders-7", oldEpoch, before.Next); !errors.Is(err, wal.ErrStaleEpoch) {
			t.Fatalf("the old owner's late truncation: %v, want ErrStaleEpoch", err)
		}
		if after := sh.Info(); after != before || len(sh.Manifest().Parts) != 0 {
			t.Fatalf("the new owner's backlog changed under it: %+v, then %+v, %d parts", before, after, len(sh.Manifest().Parts))
		}

		fd.SetRules()
		e.sealer.Pause("orders-7", false)
		waitFor(t, 5*time.Second, "the new owner seals the backlog", sealed(e, sh, 1))
		readBackFromParts(t, sh, want)
	})
}

// TestAPartThatCannotBeReadFailsTheWholeRead: a part that is missing or damaged on
// the bucket ends the read with an error naming it, never a shorter history.
func TestAPartThatCannotBeReadFailsTheWholeRead(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		bucket, _ := newBucket(t, b)
		e := open(t, Options{Dir: t.TempDir(), Bucket: bucket, Seal: quietSealOptions()})
		sh := openShard(t, e, "s")
		for range 2 {
			appendBatches(t, sh, 3)
			if _, err := sh.Seal(ctx, 1<<20); err != nil {
				t.Fatal(err)
			}
		}
		appendBatches(t, sh, 1) // and a tail in the WAL
		parts := sh.Manifest().Parts
		if len(parts) != 2 {
			t.Fatalf("%d parts, want 2", len(parts))
		}
		for _, c := range []struct {
			name   string
			damage func(key string)
		}{
			{"damaged", func(key string) {
				data, _, err := bucket.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				data[len(data)/2] ^= 0xff
				if _, err := bucket.PutBytes(ctx, key, data); err != nil {
					t.Fatal(err)
				}
			}},
			{"missing", func(key string) {
				if err := bucket.Delete(ctx, key); err != nil {
					t.Fatal(err)
				}
			}},
		} {
			name := c.name
			t.Run(name, func(t *testing.T) {
				c.damage(parts[1].Key)
				var n int
				var readErr error
				for _, err := range sh.Read(ctx, 0) {
					if err != nil {
						readErr = err
						break
					}
					n++
				}
				if readErr == nil || !strings.Contains(readErr.Error(), parts[1].Key) {
					t.Fatalf("read of a %s part: %d records and %v, want an error naming %s", name, n, readErr, parts[1].Key)
				}
				if n > int(parts[0].Count) {
					t.Fatalf("%d records read past the unreadable part", n)
				}
			})
		}
	})
}
