package tests

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/api/option"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/manifest"
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
	shortLease = manifest.LeaseOptions{Duration: time.Second, SkewMargin: 100 * time.Millisecond}
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
	killAndMove(t, "TestAKilledOwnersAcknowledgedRecordsAreRecoveredOnAnotherMachine", nil)
}

// killAndMove runs the kill points of a child on Dir A whose shards machine B
// takes over, with env added to the child's.
func killAndMove(t *testing.T, test string, env []string) {
	dirA, dirB, bucketDir := t.TempDir(), t.TempDir(), t.TempDir()
	env = append(env, envCrashBucket+"="+bucketDir, envCrashShortLease+"=1")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	acked := map[string][]batch{}
	parts := 0
	for kill := range *kills {
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		for _, b := range runAndKill(t, test, dirA, env, kill, delay) {
			acked[b.shard] = append(acked[b.shard], b)
		}
		d, err := local.New(bucketDir)
		if err != nil {
			t.Fatal(err)
		}
		b, err := substrate.New(d, substrate.Options{Name: "local"})
		if err != nil {
			t.Fatal(err)
		}
		verify(t, engine.Options{Dir: dirB, Bucket: b, Lease: shortLease, RenewEvery: shortRenew}, acked, kill, &parts, true)
		b.Close()
	}
	t.Logf("%d kill points; the shards held %d parts at the takeovers", *kills, parts)
}
