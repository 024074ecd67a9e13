package wal

import (
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A read that starts while a truncation raises the floor past its from must fail
// with ErrTruncated: it may not start later than from (records skipped, which a
// reader above reports as corruption), end short, or report corruption itself.
func TestAReadRacingATruncationNeverEndsShortOrReportsFalseCorruption(t *testing.T) {
	// Truncations must come often to land inside a read's setup, which lasts well
	// under a microsecond: skip every sync (no crash here needs them). Tiny segments
	// make the log move to a new one, and drop the sealed ones, all the time: a
	// read must hold the segments of the pages it took.
	l := open(t, t.TempDir(), Options{SegmentSize: 4 << 10, FS: syncFS{FS: vfs.Default, onSync: func(string) bool { return false }}})
	defer l.Close()
	ctx := t.Context()
	if _, err := l.Append(ctx, "s", 0, recs("r", 1)); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var truncations atomic.Int64
	var writer sync.WaitGroup
	writer.Go(func() {
		for !stop.Load() {
			if _, err := l.Append(ctx, "s", 0, recs("r", 1)); err != nil {
				t.Error(err)
				return
			}
			// Keep the last page (one record) and drop the rest.
			if err := l.TruncateThrough("s", 0, l.Info("s").Next-1); err != nil {
				t.Error(err)
				return
			}
			truncations.Add(1)
		}
	})
	var whole, truncated, bad atomic.Int64
	deadline := time.Now().Add(2 * time.Second)
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for time.Now().Before(deadline) && bad.Load() == 0 {
				// The read must reach at least what was durable when it began.
				end := l.state("s").acked.Load()
				from := l.Info("s").Floor
				next := from
				var failure string
				for p, err := range l.Pages("s", from) {
					switch {
					case errors.Is(err, ErrTruncated) && next == from:
						truncated.Add(1)
					case err != nil:
						failure = err.Error()
					case p.FirstOffset > next || p.NextOffset() <= next:
						failure = fmt.Sprintf("a page at %d where %d was due", p.FirstOffset, next)
					default:
						next = p.NextOffset()
						continue
					}
					break
				}
				switch {
				case failure != "":
				case next == from: // ErrTruncated, or nothing durable yet
					continue
				case next < end:
					failure = fmt.Sprintf("ended at %d, short of %d, durable when the read began", next, end)
				default:
					whole.Add(1)
					continue
				}
				if bad.Add(1) == 1 {
					t.Errorf("read from the floor %d: %s", from, failure)
				}
			}
		})
	}
	readers.Wait()
	stop.Store(true)
	writer.Wait()
	t.Logf("%d truncations; reads: %d whole, %d ErrTruncated, %d bad", truncations.Load(), whole.Load(), truncated.Load(), bad.Load())
	if whole.Load() == 0 {
		t.Fatal("no read ever started before a truncation: the test proves nothing")
	}
}

// Pebble makes a batch applied with ApplyNoSyncWait visible before its sync: a read
// must still not see a page until the append's sync returned, since the append may
// yet fail and, after a crash, another record take its offsets.
func TestAReadNeverReturnsARecordBeforeItIsDurable(t *testing.T) {
	var fs syncGate
	l := open(t, t.TempDir(), Options{FS: syncFS{FS: vfs.Default, onSync: fs.wait}})
	defer l.Close()
	ctx := t.Context()
	if _, err := l.Append(ctx, "s", 0, recs("durable", 2)); err != nil {
		t.Fatal(err)
	}
	release := fs.hold()
	defer release() // before the Close, which waits for the append
	appended := make(chan error, 1)
	go func() {
		_, err := l.Append(ctx, "s", 0, recs("pending", 3))
		appended <- err
	}()
	select {
	case <-fs.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the append never synced")
	}
	// The sync may wait before the page is applied: wait for its offsets to be taken.
	for deadline := time.Now().Add(10 * time.Second); l.Info("s").Next != 5; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("next %d with the second append waiting for its sync, want 5", l.Info("s").Next)
		}
	}
	for name, pages := range map[string]func(string, uint64) iter.Seq2[Page, error]{
		"Pages": l.Pages, "PagesAliased": l.PagesAliased,
	} {
		var got []uint64
		for p, err := range pages("s", 0) {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			got = append(got, p.FirstOffset)
		}
		if len(got) != 1 || got[0] != 0 {
			t.Fatalf("%s during the second append's sync: pages at %v, want only the durable one at 0", name, got)
		}
		for p := range pages("s", 2) {
			t.Fatalf("%s from 2 during its sync yielded the page at %d", name, p.FirstOffset)
		}
	}
	release()
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, l, "s", 0); len(got) != 5 || string(got[2]) != "pending-0" {
		t.Fatalf("after the sync: %q", got)
	}
}

// syncFS is a file system whose file syncs call onSync with the file's name first,
// and are skipped if it returns false.
type syncFS struct {
	vfs.FS
	onSync func(name string) bool
}

func (fs syncFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	return syncFile{File: f, name: name, onSync: fs.onSync}, nil
}

func (fs syncFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs syncFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

func (fs syncFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

type syncFile struct {
	vfs.File
	name   string
	onSync func(name string) bool
}

func (f syncFile) Sync() error {
	if !f.onSync(f.name) {
		return nil
	}
	return f.File.Sync()
}

func (f syncFile) SyncData() error {
	if !f.onSync(f.name) {
		return nil
	}
	return f.File.SyncData()
}

func (f syncFile) SyncTo(length int64) (bool, error) {
	if !f.onSync(f.name) {
		return false, nil
	}
	return f.File.SyncTo(length)
}

// syncGate holds the syncs of pebble's log, from hold until the release it returns.
type syncGate struct {
	mu      sync.Mutex
	gate    chan struct{} // closed at release; nil when not holding
	held    chan struct{} // closed when a sync first waits at the gate
	entered bool
}

func (g *syncGate) hold() (release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.held, g.entered = make(chan struct{}), make(chan struct{}), false
	gate := g.gate
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.gate = nil
			g.mu.Unlock()
			close(gate)
		})
	}
}

// wait is an onSync for syncFS: it holds the syncs of pebble's log files (*.log).
func (g *syncGate) wait(name string) bool {
	if !strings.HasSuffix(name, ".log") {
		return true
	}
	g.mu.Lock()
	gate := g.gate
	if gate != nil && !g.entered {
		g.entered = true
		close(g.held)
	}
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return true
}
