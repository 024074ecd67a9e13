package tests

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/api/option"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/internal/testclock"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/gcs"
	"github.com/l0store/l0/substrate/local"
)

// machines returns, for each substrate the move tests run on, a function that
// gives a new machine its own client of one shared bucket: a local directory (each
// machine its own driver on it), and fake-gcs-server as a process over HTTP (each
// machine its own storage client).
func machines(t *testing.T) map[string]func(t *testing.T) *substrate.Bucket {
	t.Helper()
	root := t.TempDir()
	srv, err := emulator.StartGCSProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	name := fmt.Sprintf("l0-move-%d", time.Now().UnixNano())
	first, err := srv.NewDriver(t.Context(), name) // creates the bucket
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	bucket := func(t *testing.T, d substrate.Driver, err error) *substrate.Bucket {
		if err != nil {
			t.Fatal(err)
		}
		b, err := substrate.New(d, substrate.Options{Name: "shared"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	return map[string]func(t *testing.T) *substrate.Bucket{
		"local": func(t *testing.T) *substrate.Bucket {
			d, err := local.New(filepath.Join(root, "bucket"))
			return bucket(t, d, err)
		},
		"gcs": func(t *testing.T) *substrate.Bucket {
			d, err := gcs.Open(t.Context(), gcs.Config{Bucket: name, Endpoint: srv.Endpoint, ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
			return bucket(t, d, err)
		},
	}
}

// machine is an engine on a Dir and a client of its own.
func machine(t *testing.T, b *substrate.Bucket, opts engine.Options) *engine.Engine {
	t.Helper()
	opts.Dir, opts.Bucket = t.TempDir(), b
	// Seals only when asked (or inherited): the tests decide what is sealed.
	opts.Seal = seal.Options{SizeBytes: 1 << 40, Age: time.Hour, Interval: 10 * time.Millisecond}
	e, err := engine.Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// appendN appends n records of 100 bytes named prefix-i, ten per append.
func appendN(t *testing.T, sh *shard.Shard, prefix string, n int) [][]byte {
	t.Helper()
	var all [][]byte
	for i := 0; i < n; i += 10 {
		var batch [][]byte
		for j := i; j < min(n, i+10); j++ {
			batch = append(batch, fmt.Appendf(nil, "%s-%04d-%s", prefix, j, bytes.Repeat([]byte("x"), 88)))
		}
		first, err := sh.Append(t.Context(), batch...)
		if err != nil {
			t.Fatal(err)
		}
		if want := sh.Info().Next - uint64(len(batch)); first != want {
			t.Fatalf("append at %d, want %d", first, want)
		}
		all = append(all, batch...)
	}
	return all
}

// readShard reads sh from 0, checking dense offsets.
func readShard(t *testing.T, sh *shard.Shard) [][]byte {
	t.Helper()
	var out [][]byte
	for rec, err := range sh.Read(t.Context(), 0) {
		if err != nil {
			t.Fatalf("read %s after %d records: %v", sh.ID(), len(out), err)
		}
		if rec.Offset != uint64(len(out)) {
			t.Fatalf("read %s: offset %d after %d records", sh.ID(), rec.Offset, len(out))
		}
		out = append(out, rec.Value)
	}
	return out
}

func sameRecords(t *testing.T, what string, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d records, want %d", what, len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("%s: offset %d holds %q, want %q", what, i, got[i], want[i])
		}
	}
}

// TestALagMoveToAnotherMachineKeepsEveryAcknowledgedRecord: machine A acknowledges
// 400 records, the first 100 sealed, and retires the shard (a lag move: no seal).
// Machine B, on its own Dir and client, opens it: it reads all 400, seals the
// backlog at once, and appends after A's last. Then the shard moves back: A reopens
// it, and reads everything, having counted nothing stranded on either machine.
func TestALagMoveToAnotherMachineKeepsEveryAcknowledgedRecord(t *testing.T) {
	for name, client := range machines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			eA := machine(t, client(t), engine.Options{})
			eB := machine(t, client(t), engine.Options{})

			a, err := eA.OpenShard(ctx, "orders-7")
			if err != nil {
				t.Fatal(err)
			}
			want := appendN(t, a, "a", 100)
			if _, err := a.Seal(ctx, math.MaxUint64); err != nil {
				t.Fatal(err)
			}
			want = append(want, appendN(t, a, "a", 300)[:]...)
			if s := a.Info().Sealed; s != 100 {
				t.Fatalf("A sealed through %d, want 100", s)
			}
			if err := a.Retire(ctx); err != nil {
				t.Fatal(err)
			}

			b, err := eB.OpenShard(ctx, "orders-7")
			if err != nil {
				t.Fatal(err)
			}
			sameRecords(t, "B reads", readShard(t, b), want)
			deadline := time.Now().Add(10 * time.Second)
			for b.Info().Sealed != 400 {
				if time.Now().After(deadline) {
					t.Fatalf("B's inherited backlog not sealed at once: sealed through %d", b.Info().Sealed)
				}
				time.Sleep(5 * time.Millisecond)
			}
			more := appendN(t, b, "b", 10)
			want = append(want, more...)
			if err := b.Retire(ctx); err != nil { // a lag move back, its 10 unsealed
				t.Fatal(err)
			}

			a, err = eA.OpenShard(ctx, "orders-7")
			if err != nil {
				t.Fatal(err)
			}
			sameRecords(t, "A reads after the move back", readShard(t, a), want)
			if first, err := a.Append(ctx, []byte("after")); err != nil || first != uint64(len(want)) {
				t.Fatalf("A's next append at %d (%v), want %d", first, err, len(want))
			}
			for m, e := range map[string]*engine.Engine{"A": eA, "B": eB} {
				if n := e.Metrics().StrandedRecords; n != 0 {
					t.Errorf("%s counted %d records stranded", m, n)
				}
			}
		})
	}
}

// The lease of the children that another machine takes over from: short, so that
// each kill point waits about a second for it.
var (
	shortLease = engine.LeaseOptions{Duration: time.Second, SkewMargin: 100 * time.Millisecond}
	shortRenew = 200 * time.Millisecond
)

// TestAKilledOwnersAcknowledgedRecordsAreRecoveredOnAnotherMachine: a child process
// on Dir A appends to several shards in Remote mode and is killed with SIGKILL at
// a random moment; machine B, on Dir B with its own client of the bucket, takes
// every shard over once A's lease has run out, and finds every record A
// acknowledged, byte for byte, exactly once, at its offset. B then hands the
// shards back (a cooperative close), so that each child takes over from B: the
// shards go back and forth across the kill points.
func TestAKilledOwnersAcknowledgedRecordsAreRecoveredOnAnotherMachine(t *testing.T) {
	if dir := os.Getenv(envCrashChild); dir != "" {
		crashChild(dir)
		return
	}
	const test = "TestAKilledOwnersAcknowledgedRecordsAreRecoveredOnAnotherMachine"
	t.Run("local", func(t *testing.T) {
		shared := t.TempDir()
		killAndMove(t, test, []string{envCrashBucket + "=" + filepath.Join(shared, "bucket")},
			func(t *testing.T) *substrate.Bucket {
				b, err := localBucket(shared) // the child's, through a client of this machine's own
				if err != nil {
					t.Fatal(err)
				}
				return b
			})
	})
	t.Run("gcs", func(t *testing.T) {
		srv, err := emulator.StartGCSProcess()
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Stop()
		name := fmt.Sprintf("l0-kill-%d", time.Now().UnixNano())
		first, err := srv.NewDriver(t.Context(), name) // creates the bucket
		if err != nil {
			t.Fatal(err)
		}
		first.Close()
		killAndMove(t, test, []string{envCrashGCS + "=" + srv.Endpoint + "|" + name},
			func(t *testing.T) *substrate.Bucket {
				d, err := gcs.Open(t.Context(), gcs.Config{Bucket: name, Endpoint: srv.Endpoint, ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
				if err != nil {
					t.Fatal(err)
				}
				b, err := substrate.New(d, substrate.Options{Name: "shared"})
				if err != nil {
					t.Fatal(err)
				}
				return b
			})
	})
}

// killAndMove runs the kill points of a child on Dir A whose shards machine B, on
// a client of its own from client, takes over; env (which names the child's
// bucket) is added to the child's.
func killAndMove(t *testing.T, test string, env []string, client func(t *testing.T) *substrate.Bucket) {
	dirA, dirB := t.TempDir(), t.TempDir()
	env = append(env, envCrashShortLease+"=1")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	acked := map[string][]batch{}
	parts := 0
	for kill := range *kills {
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		for _, b := range runAndKill(t, test, dirA, env, kill, delay) {
			acked[b.shard] = append(acked[b.shard], b)
		}
		b := client(t)
		verify(t, engine.Options{Dir: dirB, Bucket: b, Lease: shortLease, RenewEvery: shortRenew}, acked, kill, &parts, true)
		b.Close()
	}
	t.Logf("%d kill points; the shards held %d parts at the takeovers", *kills, parts)
}

// TestAFencedEngineAcknowledgesNothingFromItsOldStream: machine A's clock lags
// (frozen), so A still believes its lease on shard x holds when machine B, whose
// clock says it ran out, takes x over and fences A's tail. A keeps appending to x
// throughout. Every append A acknowledged is in B's history, at its offset: none
// was acknowledged after the fence, and B hands out no offset A acknowledged. A's
// other shard, y, carries on in a new incarnation of A's tail, and a move of y to
// B afterwards keeps every record A acknowledged on it, across the change.
func TestAFencedEngineAcknowledgesNothingFromItsOldStream(t *testing.T) {
	for name, client := range machines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			lease := engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}
			clkA, clkB := testclock.New(), testclock.New()
			clkB.Advance(lease.Duration + lease.SkewMargin + time.Second)
			eA := machine(t, client(t), engine.Options{Clock: clkA, Lease: lease, RenewEvery: time.Second})
			eB := machine(t, client(t), engine.Options{Clock: clkB, Lease: lease, RenewEvery: time.Second})
			x, err := eA.OpenShard(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			y, err := eA.OpenShard(ctx, "y")
			if err != nil {
				t.Fatal(err)
			}
			wantY := appendN(t, y, "y", 20)

			// A appends to x from 4 goroutines until told to stop.
			type ack struct {
				first uint64
				recs  [][]byte
			}
			var (
				mu    sync.Mutex
				acked []ack
				stop  = make(chan struct{})
				wg    sync.WaitGroup
			)
			for g := range 4 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						recs := [][]byte{fmt.Appendf(nil, "x-g%d-%d", g, i)}
						first, err := x.Append(ctx, recs...)
						if err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						mu.Lock()
						acked = append(acked, ack{first, recs})
						mu.Unlock()
					}
				})
			}
			time.Sleep(200 * time.Millisecond)
			b, err := eB.OpenShard(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // A goes on trying
			close(stop)
			wg.Wait()
			more := appendN(t, b, "b", 10)
			got := readShard(t, b)
			if len(acked) == 0 {
				t.Fatal("A acknowledged nothing before the takeover")
			}
			for _, a := range acked {
				for i, r := range a.recs {
					off := a.first + uint64(i)
					if off >= uint64(len(got)) || !bytes.Equal(got[off], r) {
						t.Fatalf("A acknowledged %q at %d; B's history holds %d records, and not it there", r, off, len(got))
					}
				}
			}
			sameRecords(t, "B's own records, after A's", got[len(got)-len(more):], more)
			// One fence, or more: A may have moved x to a new incarnation of its
			// tail before B's takeover landed, and B fenced that one too.
			if eB.Metrics().FencesWritten == 0 {
				t.Fatal("B took x over without fencing A's tail")
			}

			// y carries on in A's next incarnation, and moves with everything.
			deadline := time.Now().Add(10 * time.Second)
			for {
				if _, err := y.Append(ctx, []byte("y-probe")); err == nil {
					wantY = append(wantY, []byte("y-probe"))
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("y's appends did not resume in a new incarnation")
				}
				time.Sleep(10 * time.Millisecond)
			}
			wantY = append(wantY, appendN(t, y, "y2", 20)...)
			if err := y.Retire(ctx); err != nil {
				t.Fatal(err)
			}
			yB, err := eB.OpenShard(ctx, "y")
			if err != nil {
				t.Fatal(err)
			}
			gotY := readShard(t, yB)
			// y-probe attempts that failed may have been written (their outcome was
			// unknown): every acknowledged record must be there, in order.
			k := 0
			for _, r := range gotY {
				if k < len(wantY) && bytes.Equal(r, wantY[k]) {
					k++
				}
			}
			if k != len(wantY) {
				t.Fatalf("B reads %d records of y; A's acknowledged ones are not all there, in order (%d of %d)", len(gotY), k, len(wantY))
			}
		})
	}
}

// TestLocalModeLosesAtMostTheUnshippedWindow: the kill of TestAKilledOwners... in
// Local mode, which acknowledges on the local fsync. Machine B loses what the
// child had not shipped — never more than the unshipped window its gauge last
// reported plus what it acknowledged after that report — and only at the end of a
// shard: every acknowledged record before the first one missing is there, byte for
// byte, and nothing B reads was not appended by the child.
func TestLocalModeLosesAtMostTheUnshippedWindow(t *testing.T) {
	if dir := os.Getenv(envCrashChild); dir != "" {
		crashChild(dir)
		return
	}
	dirA, dirB, shared := t.TempDir(), t.TempDir(), t.TempDir()
	env := []string{envCrashBucket + "=" + filepath.Join(shared, "bucket"), envCrashShortLease + "=1", envCrashLocal + "=1"}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	var lostTotal int
	for kill := range *kills {
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		acked := runAndKill(t, "TestLocalModeLosesAtMostTheUnshippedWindow", dirA, env, kill, delay)
		if len(acked) == 0 {
			continue
		}
		last := acked[len(acked)-1]
		bound := last.window
		for _, b := range acked {
			if b.report == last.report {
				bound += int64(b.bytes)
			}
		}
		bk, err := localBucket(shared) // the child's, through a client of this machine's own
		if err != nil {
			t.Fatal(err)
		}
		lost := takeOverAndCount(t, engine.Options{Dir: dirB, Bucket: bk, Lease: shortLease, RenewEvery: shortRenew}, acked, kill)
		bk.Close()
		if int64(lost) > bound {
			t.Fatalf("kill %d: lost %d acknowledged bytes; the window last reported was %d bytes, with %d bytes acknowledged after it",
				kill, lost, last.window, bound-last.window)
		}
		lostTotal += lost
	}
	t.Logf("%d kill points in Local mode; %d acknowledged bytes lost in all, each within the reported window", *kills, lostTotal)
}

// takeOverAndCount takes every shard over on opts's machine, checks that what it
// reads of the acknowledged batches is a prefix of each shard's, byte for byte, and
// hands the shards back; it returns the bytes of the acknowledged batches missing.
func takeOverAndCount(t *testing.T, opts engine.Options, acked []batch, kill int) (lost int) {
	t.Helper()
	ctx := t.Context()
	e, err := engine.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for s := range crashShards {
		id := fmt.Sprintf("shard-%d", s)
		sh, err := e.OpenShard(ctx, id, engine.WaitForLease())
		if err != nil {
			t.Fatal(err)
		}
		var recs [][]byte
		for rec, err := range sh.Read(ctx, 0) {
			if err != nil {
				t.Fatalf("kill %d: read %s: %v", kill, id, err)
			}
			recs = append(recs, rec.Value)
		}
		for _, b := range acked {
			if b.shard != id {
				continue
			}
			end := b.first + uint64(b.count)
			switch {
			case end <= uint64(len(recs)):
				if batchCRC(recs[b.first:end]) != b.crc {
					t.Fatalf("kill %d: %s: the acknowledged batch at %d+%d reads back other bytes", kill, id, b.first, b.count)
				}
			case b.first >= uint64(len(recs)):
				lost += b.bytes
			default:
				t.Fatalf("kill %d: %s: the acknowledged batch at %d+%d is cut at %d", kill, id, b.first, b.count, len(recs))
			}
		}
		if err := sh.Close(ctx); err != nil {
			t.Fatalf("kill %d: close %s: %v", kill, id, err)
		}
	}
	return lost
}
