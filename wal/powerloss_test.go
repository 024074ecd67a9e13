package wal

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
)

// ackLog records what a running log acknowledged, per shard.
type ackLog struct {
	mu     sync.Mutex
	pages  map[string]map[uint64][][]byte // shard → first offset → records
	floors map[string]uint64              // highest acknowledged truncation
	epochs map[string]uint64              // last acknowledged SetEpoch
}

func newAckLog() *ackLog {
	return &ackLog{pages: map[string]map[uint64][][]byte{}, floors: map[string]uint64{}, epochs: map[string]uint64{}}
}

func (a *ackLog) page(shard string, first uint64, rs [][]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pages[shard] == nil {
		a.pages[shard] = map[uint64][][]byte{}
	}
	a.pages[shard][first] = rs
}

func (a *ackLog) floor(shard string, f uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.floors[shard] = max(a.floors[shard], f)
}

// snapshot copies what was acknowledged so far.
func (a *ackLog) snapshot() (map[string]map[uint64][][]byte, map[string]uint64, map[string]uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := map[string]map[uint64][][]byte{}
	for s, m := range a.pages {
		p[s] = map[uint64][][]byte{}
		for k, v := range m {
			p[s][k] = v
		}
	}
	f, e := map[string]uint64{}, map[string]uint64{}
	for k, v := range a.floors {
		f[k] = v
	}
	for k, v := range a.epochs {
		e[k] = v
	}
	return p, f, e
}

// checkRecovered checks that l holds every acknowledged page at or above its floor,
// byte for byte, densely, and that floors and epochs did not go back.
func checkRecovered(t *testing.T, l *Log, pages map[string]map[uint64][][]byte, floors, epochs map[string]uint64) {
	t.Helper()
	for shard, m := range pages {
		info := l.Info(shard)
		if info.Floor < floors[shard] {
			t.Fatalf("shard %s: floor %d after the crash, a truncation through %d was acknowledged", shard, info.Floor, floors[shard])
		}
		if info.Epoch < epochs[shard] {
			t.Fatalf("shard %s: epoch %d after the crash, %d was acknowledged", shard, info.Epoch, epochs[shard])
		}
		got := map[uint64][]byte{}
		next := info.Floor
		for p, err := range l.Pages(shard, info.Floor) {
			if err != nil {
				t.Fatalf("shard %s: read: %v", shard, err)
			}
			if p.FirstOffset != next {
				t.Fatalf("shard %s: page at %d after %d", shard, p.FirstOffset, next)
			}
			for i, r := range p.Records {
				got[p.FirstOffset+uint64(i)] = r
			}
			next = p.NextOffset()
		}
		if next != info.Next {
			t.Fatalf("shard %s: read to %d, next %d", shard, next, info.Next)
		}
		for first, rs := range m {
			for i, r := range rs {
				off := first + uint64(i)
				if off < info.Floor {
					continue
				}
				if g, ok := got[off]; !ok || !bytes.Equal(g, r) {
					t.Fatalf("shard %s: acknowledged offset %d (page %d) reads %q, want %q (floor %d next %d)", shard, off, first, g, r, info.Floor, info.Next)
				}
			}
		}
	}
}

// TestRandomCrashesKeepEveryAcknowledgedAppend runs appenders, truncations,
// epoch changes and readers over small recycled segments, takes a power-loss copy
// of the file system at a random moment (keeping a random share of what was not
// synced), and opens it: the open must succeed and hold everything acknowledged
// before the copy. It then crashes the reopened log too, right after its open.
func TestRandomCrashesKeepEveryAcknowledgedAppend(t *testing.T) {
	deadline := time.Now().Add(6 * time.Second)
	for iter := 0; time.Now().Before(deadline); iter++ {
		seed := uint64(iter)*7919 + 17
		t.Run(fmt.Sprint(seed), func(t *testing.T) { huntCrashOnce(t, seed) })
		if t.Failed() {
			return
		}
	}
}

func huntCrashOnce(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	fs := vfs.NewCrashableMem()
	opts := Options{
		FS:              renameThenOpen{fs},
		SegmentSize:     int64(2<<10 + rng.IntN(6<<10)),
		RecycleSegments: rng.IntN(4) - 1,
		AckedInterval:   time.Duration(1+rng.IntN(5)) * time.Millisecond,
	}
	ctx := context.Background()
	l := open(t, "wal", opts)
	acks := newAckLog()
	shards := []string{"a", "b", "c"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var epochMu sync.Mutex
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)+100))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				shard := shards[r.IntN(len(shards))]
				n := 1 + r.IntN(4)
				rs := make([][]byte, n)
				for j := range rs {
					rs[j] = fmt.Appendf(nil, "w%d-%d-%d-%s", w, i, j, bytes.Repeat([]byte{'x'}, r.IntN(300)))
				}
				epochMu.Lock()
				e := l.Info(shard).Epoch
				epochMu.Unlock()
				first, err := l.Append(ctx, shard, e, rs)
				if errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrClosed) {
					continue
				}
				if err != nil {
					t.Errorf("append: %v", err)
					return
				}
				acks.page(shard, first, rs)
			}
		})
	}
	// A truncator: seals each shard through a page boundary up to where it read.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 7))
		for {
			select {
			case <-stop:
				return
			default:
			}
			shard := shards[r.IntN(len(shards))]
			info := l.Info(shard)
			through := info.Floor
			k := r.IntN(6)
			if r.IntN(2) == 0 {
				k = 1 << 30 // through every durable page
			}
			for p, err := range l.Pages(shard, info.Floor) {
				if err != nil {
					if !errors.Is(err, ErrTruncated) {
						t.Errorf("read: %v", err)
					}
					break
				}
				through = p.NextOffset()
				if k--; k < 0 {
					break
				}
			}
			err := l.TruncateThrough(shard, info.Epoch, through)
			if errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrClosed) {
				continue
			}
			if err != nil {
				t.Errorf("truncate %s through %d: %v", shard, through, err)
				return
			}
			acks.floor(shard, through)
			if r.IntN(8) == 0 {
				epochMu.Lock()
				e := l.Info(shard).Epoch + 1
				err := l.SetEpoch(shard, e)
				epochMu.Unlock()
				if err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("set epoch: %v", err)
					return
				}
				if err == nil {
					acks.mu.Lock()
					acks.epochs[shard] = e
					acks.mu.Unlock()
				}
			}
			time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
		}
	})
	time.Sleep(time.Duration(5+rng.IntN(60)) * time.Millisecond)
	pages, floors, epochs := acks.snapshot()
	pct := []int{0, 0, 30, 50, 90, 100}[rng.IntN(6)]
	cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
	if pct > 0 {
		cfg.RNG = rand.New(rand.NewPCG(seed, 2))
	}
	crashed := fs.CrashClone(cfg)
	close(stop)
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return
	}
	reopts := opts
	reopts.FS = crashed
	l2, err := Open("wal", reopts)
	if err != nil {
		t.Fatalf("open after a crash (segment size %d, recycle %d, %d%% unsynced kept): %v\n%s",
			opts.SegmentSize, opts.RecycleSegments, pct, err, crashed.String())
	}
	checkRecovered(t, l2, pages, floors, epochs)
	if testing.Verbose() {
		live, pooled := l2.Segments()
		t.Logf("fsyncs %d, segments live %d pooled %d, pct %d\n%s", l.Fsyncs(), live, pooled, pct, crashed.String())
	}
	// Crash again right after the open (its closing group and watermark synced).
	again := crashed.CrashClone(vfs.CrashCloneCfg{})
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	reopts.FS = again
	l3, err := Open("wal", reopts)
	if err != nil {
		t.Fatalf("open after a second crash, right after the first open: %v", err)
	}
	checkRecovered(t, l3, pages, floors, epochs)
	l3.Close()
}

// renameThenOpen reuses a file by a rename and an open for writing, as the
// operating system's file system does, instead of pebble's in-memory
// ReuseForWrite, which holds its clone lock for reading across a Rename that
// takes it again: a CrashClone between the two waits for the first, and the second
// waits for the CrashClone, so the test hangs (seen once in 600 runs of a
// concurrent harness).
type renameThenOpen struct{ vfs.FS }

func (f renameThenOpen) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if err := f.Rename(oldname, newname); err != nil {
		return nil, err
	}
	return f.OpenReadWrite(newname, category)
}
