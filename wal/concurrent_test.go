package wal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestEverythingAtOnceThenClose runs appends, truncations, reads, backlogs
// handed to the sink again (Reship), epoch changes with adoptions, and finally Close, all
// at once over small recycled segments: nothing may deadlock, race (run with
// -race), read a closed file, or fail other than ErrClosed/ErrStaleEpoch/
// ErrTruncated; and the log reopens to what it held.
func TestEverythingAtOnceThenClose(t *testing.T) {
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) { huntEverything(t, uint64(round)) })
	}
}

func huntEverything(t *testing.T, seed uint64) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := Options{SegmentSize: 4 << 10, RecycleSegments: int(seed%3) + 1, AckedInterval: time.Millisecond}
	l := open(t, dir, opts)
	l.ShipTo(&testSink{}, ShipOptions{})
	shards := []string{"a", "b", "c"}
	ok := func(err error) bool {
		return err == nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrTruncated) ||
			errors.Is(err, ErrNotPageBoundary)
	}
	var closed atomic.Bool
	var wg sync.WaitGroup
	run := func(name string, f func(r *rand.Rand) error) {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(len(name))))
			for !closed.Load() {
				if err := f(r); !ok(err) {
					t.Errorf("%s: %v", name, err)
					return
				}
			}
		})
	}
	for w := range 3 {
		run(fmt.Sprint("append", w), func(r *rand.Rand) error {
			s := shards[r.IntN(len(shards))]
			_, err := l.Append(ctx, s, l.Info(s).Epoch, recs(fmt.Sprint("w", w, "-", r.IntN(1000), "-", string(make([]byte, r.IntN(400)))), 1+r.IntN(3)))
			return err
		})
	}
	var sealMu sync.Mutex // a seal and a takeover of one engine do not overlap
	run("truncate", func(r *rand.Rand) error {
		sealMu.Lock()
		defer sealMu.Unlock()
		s := shards[r.IntN(len(shards))]
		info := l.Info(s)
		through := info.Floor
		for p, err := range l.Pages(s, info.Floor) {
			if err != nil {
				return err
			}
			through = p.NextOffset()
			if r.IntN(3) == 0 {
				break
			}
		}
		return l.TruncateThrough(s, info.Epoch, through)
	})
	run("read", func(r *rand.Rand) error {
		s := shards[r.IntN(len(shards))]
		info := l.Info(s)
		next := info.Floor
		for p, err := range l.PagesAliased(s, info.Floor) {
			if err != nil {
				return err
			}
			if p.FirstOffset != next {
				return fmt.Errorf("shard %s: page at %d after %d", s, p.FirstOffset, next)
			}
			next = p.NextOffset()
			time.Sleep(time.Duration(r.IntN(20)) * time.Microsecond)
		}
		return nil
	})
	run("reship", func(r *rand.Rand) error {
		s := shards[r.IntN(len(shards))]
		info := l.Info(s)
		if _, err := l.Reship(s, info.Epoch, info.Floor); err != nil {
			return err
		}
		time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
		return nil
	})
	run("owner", func(r *rand.Rand) error {
		time.Sleep(time.Millisecond)
		sealMu.Lock()
		defer sealMu.Unlock()
		s := shards[r.IntN(len(shards))]
		info := l.Info(s)
		if err := l.SetEpoch(s, info.Epoch+1); err != nil {
			return err
		}
		// Keep the backlog above the floor.
		_, err := l.Adopt(s, info.Epoch+1, l.Info(s).Floor, true)
		return err
	})
	time.Sleep(300 * time.Millisecond)
	closeErr := make(chan error, 1)
	go func() { closeErr <- l.Close() }()
	select {
	case err := <-closeErr:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return in 30 s (a liveness bound): deadlock")
	}
	closed.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the calls did not end in 30 s after Close (a liveness bound): deadlock")
	}
	l = open(t, dir, opts)
	defer l.Close()
	for _, s := range shards {
		info := l.Info(s)
		if got := readAll(t, l, s, info.Floor); uint64(len(got)) != info.Next-info.Floor {
			t.Fatalf("shard %s: %d records from %d, want %d", s, len(got), info.Floor, info.Next-info.Floor)
		}
	}
}
