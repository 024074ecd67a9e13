package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/testfs"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

var errPowerLost = errors.New("the machine lost power")

// TestAPowerLossDropsOnlyUnacknowledgedRecords: a machine on an in-memory file
// system that keeps only what was synced appends to four shards from eight
// appenders, sealing as it goes, and loses power: its object-store calls stop
// and its file system goes back to what was last synced, keeping none, some or
// most of the rest at random (a torn tail). The engine reopened on what is left
// holds every acknowledged record at its offset, byte for byte; every other record
// it reads is one an appender tried to write, whole, and at most once.
func TestAPowerLossDropsOnlyUnacknowledgedRecords(t *testing.T) {
	for _, mode := range []engine.Durability{engine.Remote, engine.Local} {
		for round, unsynced := range []int{0, 30, 70} {
			t.Run(fmt.Sprintf("%s/unsynced %d%%", mode, unsynced), func(t *testing.T) {
				powerLoss(t, mode, uint64(round+1), unsynced)
			})
		}
	}
}

// ack is an acknowledged append: its first offset and records.
type ack struct {
	first uint64
	recs  [][]byte
}

func powerLoss(t *testing.T, mode engine.Durability, seed uint64, unsynced int) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0))
	store := mem.New()
	lost := fault.Wrap(store, seed) // the crashed machine's client
	bucket := substratetest.NewBucket(t, "shared", lost)
	fs := vfs.NewCrashableMem()
	opts := engine.Options{
		Dir: "/machine", FS: testfs.SlowSyncs(fs, time.Millisecond), Bucket: bucket, Durability: mode, RenewEvery: time.Second,
		Lease: engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond},
		Seal:  seal.Options{SizeBytes: 8 << 10, Interval: 5 * time.Millisecond},
		Tail:  engine.TailOptions{Interval: 5 * time.Millisecond},
	}
	e, err := engine.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The appenders' context ends with the power: a Remote-mode append waits for
	// a tail put that can no longer happen.
	power, off := context.WithCancel(ctx)
	shards := []string{"s0", "s1", "s2", "s3"}
	var (
		mu     sync.Mutex
		acked  = map[string][]ack{}
		tried  = map[string]bool{} // every record an appender offered
		stop   = make(chan struct{})
		writer sync.WaitGroup
	)
	for _, id := range shards {
		sh, err := e.OpenShard(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for a := range 2 {
			writer.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					recs := make([][]byte, 1+n%4)
					for i := range recs {
						recs[i] = fmt.Appendf(nil, "%s/%d/%d/%d/%s", id, a, n, i, bytes.Repeat([]byte{'x'}, 200+n%300))
					}
					mu.Lock()
					for _, r := range recs {
						tried[string(r)] = true
					}
					mu.Unlock()
					first, err := sh.Append(power, recs...)
					if err != nil {
						return // the power went while it was in flight
					}
					mu.Lock()
					acked[id] = append(acked[id], ack{first, recs})
					mu.Unlock()
				}
			})
		}
	}
	time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)

	// The power goes: nothing more reaches the object store, and of the file
	// system only what was synced survives, with a random share of the rest. What
	// was acknowledged before that instant is what must survive.
	lost.SetRules(fault.Rule{Err: errPowerLost})
	mu.Lock()
	survive := map[string][]ack{}
	for id, as := range acked {
		survive[id] = append([]ack(nil), as...)
	}
	mu.Unlock()
	after := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: unsynced, RNG: rand.New(rand.NewPCG(seed, 1))})
	close(stop)
	off()
	var dead sync.WaitGroup
	dead.Go(func() { writer.Wait(); e.Close() }) // on the lost file system, unreachable
	defer dead.Wait()

	opts.FS, opts.Bucket = testfs.SlowSyncs(after, time.Millisecond), substratetest.NewBucket(t, "shared", store)
	e2, err := engine.Open(ctx, opts)
	if err != nil {
		t.Fatalf("reopen after the power loss: %v", err)
	}
	defer e2.Close()
	total := 0
	for _, id := range shards {
		sh, err := e2.OpenShard(ctx, id)
		if err != nil {
			t.Fatalf("reopen %s after the power loss: %v", id, err)
		}
		var got [][]byte
		for rec, err := range sh.Read(ctx, 0) {
			if err != nil {
				t.Fatalf("%s: read after %d records: %v", id, len(got), err)
			}
			if rec.Offset != uint64(len(got)) {
				t.Fatalf("%s: offset %d after %d records", id, rec.Offset, len(got))
			}
			got = append(got, rec.Value)
		}
		seen := map[string]bool{}
		for off, r := range got {
			mu.Lock() // an appender past its stop check may still be offering
			offered := tried[string(r)]
			mu.Unlock()
			if !offered {
				t.Fatalf("%s: offset %d holds %q, which no appender wrote", id, off, r)
			}
			if seen[string(r)] {
				t.Fatalf("%s: %q read twice, again at offset %d", id, r, off)
			}
			seen[string(r)] = true
		}
		for _, a := range survive[id] {
			for i, r := range a.recs {
				off := a.first + uint64(i)
				if off >= uint64(len(got)) {
					t.Fatalf("%s: acknowledged record at %d lost: %d records after the power loss", id, off, len(got))
				}
				if !bytes.Equal(got[off], r) {
					t.Fatalf("%s: acknowledged offset %d holds %q, want %q", id, off, got[off], r)
				}
			}
			total += len(a.recs)
		}
	}
	if total == 0 {
		t.Fatal("nothing was acknowledged before the power loss")
	}
	t.Logf("%d acknowledged records survived", total)
}
