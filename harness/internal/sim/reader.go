package sim

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// followers follow every shard with a leaseless engine.Reader on fault-free
// clients for the whole run. What a Reader returns is in the shard's history
// whoever owns it next: the oracle holds it as durable, not soft, so that a later
// owner holding another record at its offset, or lacking it at the end, is a
// violation.
type followers struct {
	w      *world
	far    *substrate.Bucket
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   map[string]int // the errors that ended reads, by kind
}

func (w *world) startFollowers() *followers {
	far, err := substrate.New(w.far, substrate.Options{Name: "far"})
	if err != nil {
		w.violate("reader: %v", err)
		return nil
	}
	// The Reader closes no bucket: stop closes far.
	r, err := engine.OpenReader(context.Background(), engine.ReaderOptions{Replicas: []replica.Spec{
		{Name: "store", Domain: "default", Bucket: w.tails.b},
		{Name: "far", Domain: "far", Bucket: far},
	}, Poll: 2 * time.Millisecond})
	if err != nil {
		far.Close()
		w.violate("reader: %v", err)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &followers{w: w, far: far, cancel: cancel, errs: map[string]int{}}
	for _, id := range w.shards {
		f.wg.Go(func() {
			var next uint64
			for ctx.Err() == nil {
				for rec, err := range r.Read(ctx, id, next, shard.Follow()) {
					if err != nil {
						if ctx.Err() == nil {
							// An error ends a read, and the next one starts where
							// it got: it is not a broken promise (a part whose
							// bytes were flipped, say), but it is counted.
							w.tracef("reader %s at %d: %v", id, next, err)
							kind := "reader error"
							if errors.Is(err, manifest.ErrCorrupt) {
								kind = "reader corrupt"
							}
							f.mu.Lock()
							f.errs[kind]++
							f.mu.Unlock()
						}
						break
					}
					next = rec.Offset + 1
					w.readerHold(id, rec)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return f
}

// stop ends the reads, and counts their errors among the run's faults.
func (f *followers) stop() {
	if f == nil || f.cancel == nil {
		return
	}
	f.cancel()
	f.wg.Wait()
	f.cancel = nil
	f.far.Close()
	for k, n := range f.errs {
		f.w.res.Faults[k] += n
	}
}

// readerHold holds rec, returned by the leaseless reader, as durable. Its epoch
// is the newest known once the record came back, at or past that of the manifest
// the reader read: a soft record (a Local-mode acknowledgement) that it
// contradicts is taken as lost if any epoch up to there could lose it.
func (w *world) readerHold(id string, rec shard.Record) {
	m, _, err := w.tails.store.Load(context.Background(), id)
	w.o.mu.Lock()
	defer w.o.mu.Unlock()
	t := w.o.truth(id)
	epoch := t.newest
	if err == nil {
		epoch = max(epoch, m.Epoch)
	}
	if !t.tried[string(rec.Value)] {
		w.violate("the leaseless reader returned %s at %d of %s, which no append offered", short(string(rec.Value)), rec.Offset, id)
		return
	}
	w.tracef("reader %s: %s at %d", id, short(string(rec.Value)), rec.Offset)
	w.o.hold(id, rec.Offset, held{rec: string(rec.Value), epoch: epoch, machine: "reader", reader: true}, "returned by the leaseless reader")
}
