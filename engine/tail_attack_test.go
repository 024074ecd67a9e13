package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// twoMachines returns the options of two engines, each on its own Dir and its own
// client of one shared in-memory bucket; A's client goes through the returned
// fault driver. Both bucket clients carry the same name, so that a tail pointer
// one of them writes names a replica the other has.
func twoMachines(t *testing.T, lease manifest.LeaseOptions, renew time.Duration) (Options, Options, *fault.Driver, *fault.Driver) {
	t.Helper()
	drv := mem.New()
	fa, fb := fault.Wrap(drv, 1), fault.Wrap(drv, 2)
	optsA := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Lease: lease, RenewEvery: renew}
	optsB := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fb), Seal: quietSealOptions(), Lease: lease, RenewEvery: renew}
	return optsA, optsB, fa, fb
}

// holds reports whether got holds rs at offset first.
func holds(got [][]byte, first uint64, rs [][]byte) bool {
	if first+uint64(len(rs)) > uint64(len(got)) {
		return false
	}
	return equal(got[first:first+uint64(len(rs))], rs)
}

// TestAReopenOnTheSameEngineShipsTheWholeBacklog: an append whose wait for the
// tail ends with its context (ErrOutcomeUnknown) leaves its page in the WAL past
// the acknowledged watermark, and still in the flusher, which ships it under the
// old epoch. The shard retires (the page is shipped by then) and is opened again
// on the same engine: the takeover is "ours", Adopt keeps every page, but
// shipBacklog reads the WAL through Pages, which stops at the acknowledged
// watermark, so the page is not shipped under the new epoch. The next append
// lands after it, is shipped and acknowledged, and raises the watermark over the
// page. The new epoch's tail now holds [0,4) and [8,12) with nothing for [4,8):
// machine B's open of the shard fails with ErrTailMissing, and the records A
// acknowledged at [8,12) (A reads them itself) cannot reach any other machine.
//
// Expected: B opens the shard and reads A's acknowledged records at their
// offsets. Observed: B's OpenShard fails with ErrTailMissing.
func TestAReopenOnTheSameEngineShipsTheWholeBacklog(t *testing.T) {
	for _, how := range []string{"retire", "close"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			optsA, optsB, fa, _ := twoMachines(t, manifest.LeaseOptions{}, 0)
			eA := open(t, optsA)
			sh := openShard(t, eA, "s")
			first := recs("first", 4)
			if _, err := sh.Append(ctx, first...); err != nil {
				t.Fatal(err)
			}
			if how == "close" {
				// A cooperative close seals what is acknowledged, leaving the
				// page of unknown outcome alone past the sealed watermark.
				if _, err := sh.Seal(ctx, 1<<20); err != nil {
					t.Fatal(err)
				}
			}
			// The tail is slow: the next append gives up waiting for it.
			fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Latency: 400 * time.Millisecond})
			actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			_, err := sh.Append(actx, recs("unknown", 4)...)
			cancel()
			if !errors.Is(err, shard.ErrOutcomeUnknown) {
				t.Fatalf("an append that gave up waiting for the tail: %v, want ErrOutcomeUnknown", err)
			}
			fa.SetRules()
			if how == "retire" {
				if err := sh.Retire(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				time.Sleep(500 * time.Millisecond) // the page ships meanwhile
				if err := sh.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}

			n := 0
			for pg, err := range eA.log.Pages("s", eA.log.Info("s").Floor) {
				if err != nil {
					t.Fatal(err)
				}
				n += len(pg.Records)
			}
			t.Logf("before reopen: %+v, %d readable", eA.log.Info("s"), n)
			sh = openShard(t, eA, "s") // ours: the WAL's pages are the backlog
			eA.sealer.Pause("s", true)
			third := recs("third", 4)
			off, err := sh.Append(ctx, third...)
			if err != nil {
				t.Fatal(err)
			}
			if off != 8 {
				t.Fatalf("the append after the reopen at %d, want 8", off)
			}
			if got := readAll(t, sh, 0); !holds(got, off, third) {
				t.Fatalf("A does not read its own acknowledged records: %q", got)
			}
			t.Logf("A before retire: %+v %+v", sh.Info(), sh.Manifest())
			if err := sh.Retire(ctx); err != nil {
				t.Fatal(err)
			}

			eB := open(t, optsB)
			shB, err := eB.OpenShard(ctx, "s")
			if err != nil {
				t.Fatalf("B cannot take over the shard whose records A acknowledged: %v", err)
			}
			got := readAll(t, shB, 0)
			t.Logf("B: %q, manifest %+v", got, shB.Manifest())
			if !holds(got, 0, first) || !holds(got, off, third) {
				t.Fatalf("B reads %q; A acknowledged %q at 0 and %q at %d", got, first, third, off)
			}
		})
	}
}
