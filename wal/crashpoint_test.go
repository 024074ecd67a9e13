package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// pointFS counts the mutating calls on a file system (creates, renames, removes,
// writes, syncs of files and directories) and calls at(n, what) before the n-th.
type pointFS struct {
	vfs.FS
	n  *atomic.Int64
	at func(n int64, what string)
}

func (fs pointFS) point(what string) {
	n := fs.n.Add(1) - 1
	if fs.at != nil {
		fs.at(n, what)
	}
}

func (fs pointFS) wrap(f vfs.File, err error, name string) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	return pointFile{File: f, fs: fs, name: name}, nil
}

func (fs pointFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	fs.point("create " + name)
	f, err := fs.FS.Create(name, c)
	return fs.wrap(f, err, name)
}

func (fs pointFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	fs.point("reuse " + oldname + " as " + newname)
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(f, err, newname)
}

func (fs pointFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(f, err, name)
}

func (fs pointFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	return fs.wrap(f, err, name+"/")
}

func (fs pointFS) Remove(name string) error {
	fs.point("remove " + name)
	return fs.FS.Remove(name)
}

func (fs pointFS) Rename(oldname, newname string) error {
	fs.point("rename " + oldname + " to " + newname)
	return fs.FS.Rename(oldname, newname)
}

type pointFile struct {
	vfs.File
	fs   pointFS
	name string
}

func (f pointFile) Write(p []byte) (int, error) {
	f.fs.point(fmt.Sprintf("write %d to %s", len(p), f.name))
	return f.File.Write(p)
}

func (f pointFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.point(fmt.Sprintf("write %d at %d to %s", len(p), off, f.name))
	return f.File.WriteAt(p, off)
}

func (f pointFile) Sync() error {
	f.fs.point("sync " + f.name)
	return f.File.Sync()
}

func (f pointFile) SyncData() error {
	f.fs.point("sync " + f.name)
	return f.File.SyncData()
}

// shardModel is what a shard holds after an acknowledged call.
type shardModel struct {
	floor, next, epoch uint64
	recs               map[uint64]string
}

func (m shardModel) clone() shardModel {
	c := m
	c.recs = make(map[uint64]string, len(m.recs))
	for k, v := range m.recs {
		c.recs[k] = v
	}
	return c
}

type logModel map[string]shardModel

func (m logModel) clone() logModel {
	c := logModel{}
	for k, v := range m {
		c[k] = v.clone()
	}
	return c
}

// observe reads what l holds of the shards in m.
func observe(l *Log, shards []string) (logModel, error) {
	out := logModel{}
	for _, s := range shards {
		info := l.Info(s)
		sm := shardModel{floor: info.Floor, next: info.Next, epoch: info.Epoch, recs: map[uint64]string{}}
		for p, err := range l.Pages(s, info.Floor) {
			if err != nil {
				return nil, err
			}
			for i, r := range p.Records {
				sm.recs[p.FirstOffset+uint64(i)] = string(r)
			}
		}
		out[s] = sm
	}
	return out, nil
}

func (m logModel) String() string {
	var b bytes.Buffer
	for _, s := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		sm := m[s]
		fmt.Fprintf(&b, "%s: floor %d next %d epoch %d recs %d; ", s, sm.floor, sm.next, sm.epoch, len(sm.recs))
	}
	return b.String()
}

func sameModel(a, b logModel) bool {
	for k, x := range a {
		y := b[k]
		if x.floor != y.floor || x.next != y.next || x.epoch != y.epoch || len(x.recs) != len(y.recs) {
			return false
		}
		for o, r := range x.recs {
			if y.recs[o] != r {
				return false
			}
		}
	}
	return true
}

// pointWorkload runs a fixed sequence of calls on a log over fs, one at a time, and
// returns the state after each acknowledged call (states[0] is the empty log);
// done, if set, is raised after each call returns.
func pointWorkload(t *testing.T, fs vfs.FS, seed uint64, done *atomic.Int64) []logModel {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 3))
	opts := Options{FS: fs, SegmentSize: 1 << 10, RecycleSegments: 1 + int(seed%2), AckedInterval: time.Hour}
	l, err := Open("wal", opts)
	if err != nil {
		t.Fatal(err)
	}
	shards := []string{"a", "b"}
	cur := logModel{"a": {recs: map[uint64]string{}}, "b": {recs: map[uint64]string{}}}
	states := []logModel{cur.clone()}
	ack := func() {
		states = append(states, cur.clone())
		if done != nil {
			done.Add(1)
		}
	}
	for i := range 60 {
		s := shards[rng.IntN(2)]
		m := cur[s]
		switch k := rng.IntN(20); {
		case k < 12:
			rs := make([][]byte, 1+rng.IntN(3))
			for j := range rs {
				rs[j] = fmt.Appendf(nil, "%s-%d-%d-%s", s, i, j, bytes.Repeat([]byte{'x'}, 50+rng.IntN(200)))
			}
			first, err := l.Append(ctx, s, m.epoch, rs)
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			for j, r := range rs {
				m.recs[first+uint64(j)] = string(r)
			}
			m.next = first + uint64(len(rs))
		case k < 15:
			through := m.next
			if k == 14 {
				// The first page boundary above the floor, if any.
				for p, err := range l.Pages(s, m.floor) {
					if err != nil {
						t.Fatal(err)
					}
					through = p.NextOffset()
					break
				}
			}
			if err := l.TruncateThrough(s, m.epoch, through); err != nil {
				t.Fatalf("truncate: %v", err)
			}
			for o := range m.recs {
				if o < through {
					delete(m.recs, o)
				}
			}
			m.floor = max(m.floor, through)
		case k < 16:
			m.epoch++
			if err := l.SetEpoch(s, m.epoch); err != nil {
				t.Fatal(err)
			}
		case k < 17:
			// A superseded backlog: everything goes, the shard continues at sealed.
			sealed := m.floor + uint64(rng.IntN(int(m.next-m.floor)+2))
			if _, err := l.Adopt(s, m.epoch, sealed, false); err != nil {
				t.Fatalf("adopt: %v", err)
			}
			m.recs, m.floor, m.next = map[uint64]string{}, sealed, sealed
		case k < 18:
			// An import at or past the shard's end (see the Import tests for below).
			sealed := m.next + uint64(rng.IntN(3))
			rs := make([][]byte, rng.IntN(4))
			for j := range rs {
				rs[j] = fmt.Appendf(nil, "imp-%s-%d-%d", s, i, j)
			}
			if err := l.Import(s, m.epoch, sealed, sealed, rs); err != nil {
				t.Fatalf("import: %v", err)
			}
			m.recs, m.floor, m.next = map[uint64]string{}, sealed, sealed+uint64(len(rs))
			for j, r := range rs {
				m.recs[sealed+uint64(j)] = string(r)
			}
		default:
			if err := l.writeMarksNow(); err != nil {
				t.Fatal(err)
			}
		}
		cur[s] = m
		ack()
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ack()
	return states
}

// TestEveryCrashPointOpensToAnAcknowledgedState crashes a fixed sequence of
// appends, truncations, epochs, adoptions and imports before each of its file
// system calls in turn (keeping none, all, or half of what was not synced), and
// then crashes the open of that too before each of its calls. Every open must
// succeed and find the state after the last acknowledged call or after the one in
// flight: nothing acknowledged lost, nothing half applied.
func TestEveryCrashPointOpensToAnAcknowledgedState(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			huntPoints(t, seed)
		})
	}
}

func huntPoints(t *testing.T, seed uint64) {
	var count atomic.Int64
	ref := pointWorkload(t, pointFS{FS: vfs.NewCrashableMem(), n: &count}, seed, nil)
	total := count.Load()
	reached := int64(0)
	defer func() { t.Logf("%d calls in the workload, crashed before %d of them", total, reached) }()
	shards := []string{"a", "b"}
	deadline := time.Now().Add(4 * time.Second)
	for target := int64(0); target < total && time.Now().Before(deadline); target++ {
		reached = target + 1
		for pi, pct := range []int{0, 50, 100} {
			mem := vfs.NewCrashableMem()
			var (
				n       atomic.Int64
				done    atomic.Int64
				mu      sync.Mutex
				clone   *vfs.MemFS
				k       int64
				what    string
				stateAt int64
			)
			fs := pointFS{FS: mem, n: &n, at: func(i int64, w string) {
				if i != target {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				k = done.Load()
				cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: pct}
				if pct > 0 {
					cfg.RNG = rand.New(rand.NewPCG(uint64(target), seed))
				}
				clone, what = mem.CrashClone(cfg), w
				stateAt = k
			}}
			states := pointWorkload(t, fs, seed, &done)
			if len(states) != len(ref) {
				t.Fatalf("the workload is not deterministic")
			}
			mu.Lock()
			c, w, at := clone, what, stateAt
			mu.Unlock()
			if c == nil {
				continue
			}
			want := []logModel{states[at]}
			if int(at)+1 < len(states) {
				want = append(want, states[at+1])
			}
			checkOpen := func(c vfs.FS, label string) {
				t.Helper()
				l, err := Open("wal", Options{FS: c, SegmentSize: 1 << 10, AckedInterval: time.Hour})
				if err != nil {
					t.Fatalf("%s: open: %v\n%s", label, err, c.(*vfs.MemFS).String())
				}
				defer l.Close()
				got, err := observe(l, shards)
				if err != nil {
					t.Fatalf("%s: read: %v", label, err)
				}
				for _, m := range want {
					if sameModel(m, got) {
						return
					}
				}
				t.Fatalf("%s: recovered %v\nwant after call %d: %v\nor after the next: %v", label, got, at, want[0], want[len(want)-1])
			}
			label := fmt.Sprintf("crash before call %d (%s) of %d, %d%% unsynced kept, %d calls acknowledged", target, w, total, pct, at)
			// The open of the crashed copy, crashed before each of its own calls.
			for j := int64(0); pi == int(target%3); j++ {
				base := c.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(1, 1))})
				var m atomic.Int64
				var inner *vfs.MemFS
				pfs := pointFS{FS: base, n: &m, at: func(i int64, _ string) {
					if i == j {
						inner = base.CrashClone(vfs.CrashCloneCfg{})
					}
				}}
				l, err := Open("wal", Options{FS: pfs, SegmentSize: 1 << 10, AckedInterval: time.Hour})
				if err != nil {
					t.Fatalf("%s: open: %v\n%s", label, err, base.String())
				}
				l.Close()
				if inner == nil {
					break
				}
				checkOpen(inner, fmt.Sprintf("%s, then the open crashed before its call %d", label, j))
			}
			checkOpen(c, label)
		}
	}
}

var _ = errors.Is
