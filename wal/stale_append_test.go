package wal

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestAStaleAppendBesideSetEpochIsRefusedWithoutARace (run with -race): a takeover's SetEpoch runs
// while the previous owner still appends with its old epoch. Append refuses the
// stale epoch, but builds its error from st.mu.epoch after st.mu.Unlock()
// (wal/wal.go:368-369), while SetEpoch writes st.mu.epoch under the lock
// (wal/owner.go:27): a data race.
// TestAStaleAppendBesideSetEpochIsRefusedWithoutARace: a takeover's SetEpoch runs
// while the previous owner still appends under its old epoch, as in every
// takeover of a live owner's shard. Each append is refused with ErrStaleEpoch, and
// (under -race) its error reads the shard's epoch under the shard's lock.
func TestAStaleAppendBesideSetEpochIsRefusedWithoutARace(t *testing.T) {
	l := open(t, "wal", Options{FS: vfs.NewMem(), AckedInterval: time.Hour})
	defer l.Close()
	if err := l.SetEpoch("s", 1); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		defer close(stop)
		for e := uint64(2); e < 3000; e++ {
			if err := l.SetEpoch("s", e); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.Append(context.Background(), "s", 0, recs("old owner", 1)); !errors.Is(err, ErrStaleEpoch) {
					t.Errorf("append with epoch 0: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}
