package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAShardReadRacingSealsNeverEndsShortOrReportsFalseCorruption: while a writer
// appends and seals one record at a time, readers from the sealed watermark either
// read every record acknowledged before they started, or fail. A seal that
// commits and truncates between a read's manifest and its WAL pages used to end
// the read short without an error, or report a corrupt WAL where nothing was.
func TestAShardReadRacingSealsNeverEndsShortOrReportsFalseCorruption(t *testing.T) {
	ctx := context.Background()
	e := open(t, Options{Dir: t.TempDir(), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	var acked atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			first, err := sh.Append(ctx, []byte("r"))
			if err != nil {
				t.Error(err)
				return
			}
			acked.Store(first + 1)
			if _, err := sh.Seal(ctx, 1<<30); err != nil {
				t.Error(err)
				return
			}
		}
	})
	deadline := time.Now().Add(3 * time.Second)
	var reads atomic.Int64
	var rg sync.WaitGroup
	for range 4 {
		rg.Go(func() {
			for time.Now().Before(deadline) && !t.Failed() {
				want := acked.Load()
				from := sh.Info().Sealed
				if from > want {
					continue
				}
				got := from
				for rec, err := range sh.Read(ctx, from) {
					if err != nil {
						t.Errorf("read from %d: %v", from, err)
						return
					}
					if rec.Offset != got {
						t.Errorf("read from %d: offset %d where %d was due", from, rec.Offset, got)
						return
					}
					got++
				}
				if got < want {
					t.Errorf("read from %d ended at %d without an error; %d were acknowledged before it began", from, got, want)
					return
				}
				reads.Add(1)
			}
		})
	}
	rg.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d reads racing %d seals", reads.Load(), acked.Load())
}
