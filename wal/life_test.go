package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// errProcessKilled is what a killed process's calls get: nothing more of it reaches
// the file system.
var errProcessKilled = errors.New("the process was killed")

// lifeFS is one life of a process on a file system it shares with the lives after
// it: a kill stops the process's calls, and what it wrote stays in the page cache,
// where the next life reads it; only a power loss (a crash clone of the shared
// file system) drops what was not synced. before, if set, runs ahead of every call
// that changes the file system, described as "create NAME", "reuse OLD as NEW",
// "remove NAME", "rename OLD to NEW", "write N to NAME" or "sync NAME" (a
// directory's NAME ends in a slash), and may kill the process or fail the call.
type lifeFS struct {
	vfs.FS
	life *life
}

type life struct {
	killed atomic.Bool
	// before runs ahead of every call that changes the file system; an error it
	// returns fails that call, which then changes nothing.
	before func(what string) error
}

func (l *life) kill() { l.killed.Store(true) }

func (fs lifeFS) call(what string) error {
	if fs.life.killed.Load() {
		return errProcessKilled
	}
	var err error
	if fs.life.before != nil {
		err = fs.life.before(what)
	}
	if fs.life.killed.Load() {
		return errProcessKilled
	}
	return err
}

func (fs lifeFS) file(f vfs.File, err error, name string) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return lifeFile{File: f, fs: fs, name: name}, nil
}

func (fs lifeFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := fs.call("create " + name); err != nil {
		return nil, err
	}
	f, err := fs.FS.Create(name, c)
	return fs.file(f, err, name)
}

func (fs lifeFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := fs.call("reuse " + oldname + " as " + newname); err != nil {
		return nil, err
	}
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.file(f, err, newname)
}

func (fs lifeFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	if fs.life.killed.Load() {
		return nil, errProcessKilled
	}
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.file(f, err, name)
}

func (fs lifeFS) OpenDir(name string) (vfs.File, error) {
	if fs.life.killed.Load() {
		return nil, errProcessKilled
	}
	f, err := fs.FS.OpenDir(name)
	return fs.file(f, err, name+"/")
}

func (fs lifeFS) MkdirAll(dir string, perm os.FileMode) error {
	if err := fs.call("mkdir " + dir); err != nil {
		return err
	}
	return fs.FS.MkdirAll(dir, perm)
}

func (fs lifeFS) Remove(name string) error {
	if err := fs.call("remove " + name); err != nil {
		return err
	}
	return fs.FS.Remove(name)
}

func (fs lifeFS) Rename(oldname, newname string) error {
	if err := fs.call("rename " + oldname + " to " + newname); err != nil {
		return err
	}
	return fs.FS.Rename(oldname, newname)
}

// Lock never holds: a killed process's lock is free for the next life, and a
// life's Close after its kill releases nothing.
func (fs lifeFS) Lock(string) (io.Closer, error) { return nopCloser{}, nil }

type lifeFile struct {
	vfs.File
	fs   lifeFS
	name string
}

func (f lifeFile) Write(p []byte) (int, error) {
	if err := f.fs.call(fmt.Sprintf("write %d to %s", len(p), f.name)); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f lifeFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.call(fmt.Sprintf("write %d to %s", len(p), f.name)); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f lifeFile) Sync() error {
	if err := f.fs.call("sync " + f.name); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f lifeFile) SyncData() error {
	if err := f.fs.call("sync " + f.name); err != nil {
		return err
	}
	return f.File.SyncData()
}

// TestAKillInsideTheFirstOpensMkdirLosesNoDirectory: the first open is killed
// after the mkdir of the WAL directory, inside the fsync of its parent, so the
// directory's name is only in the page cache. The next life finds the directory,
// appends and closes cleanly. A power loss any time later must find the log with
// every acknowledged record: the open that found the directory made its name
// durable.
func TestAKillInsideTheFirstOpensMkdirLosesNoDirectory(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	opts := Options{AckedInterval: time.Millisecond}

	first := &life{}
	first.before = func(what string) error {
		if what == "sync ./" {
			first.kill()
		}
		return nil
	}
	o := opts
	o.FS = lifeFS{FS: mem, life: first}
	if l, err := Open("wal", o); err == nil {
		l.Close()
		t.Fatal("the first open was not killed inside the fsync of the directory's parent")
	}
	if _, err := mem.Stat("wal"); err != nil {
		t.Fatalf("the killed open left no directory: %v", err)
	}

	o.FS = lifeFS{FS: mem, life: &life{}}
	l := open(t, "wal", o)
	const n = 5
	for range n {
		if _, err := l.Append(ctx, "s", 0, recs("acked", 3)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	o.FS = mem.CrashClone(vfs.CrashCloneCfg{})
	l, err := Open("wal", o)
	if err != nil {
		t.Fatalf("open after a clean Close and a power loss: %v", err)
	}
	defer l.Close()
	if got := len(readAll(t, l, "s", 0)); got != 3*n {
		t.Fatalf("after a clean Close and a power loss the log holds %d records, %d were acknowledged", got, 3*n)
	}
}

// TestAKillInsideARotationsDirectorySyncThenAPowerLossLosesNothing: a rotation
// renames a pooled file to the next segment's name and the process is killed inside
// the directory fsync that makes the rename durable. The next life finds the new
// segment empty (its bytes the old segment's), writes its closing group there and
// syncs the file; a power loss comes before that life syncs the directory for a
// segment of its own. The open after the power loss must succeed with every
// acknowledged record: the rename the closing group went into is durable, so the
// group is not found at the start of the file under its old name.
func TestAKillInsideARotationsDirectorySyncThenAPowerLossLosesNothing(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	opts := Options{SegmentSize: 1 << 10, RecycleSegments: 1, AckedInterval: time.Hour}

	first := &life{}
	var reused atomic.Bool
	first.before = func(what string) error {
		switch {
		case strings.HasPrefix(what, "reuse "):
			reused.Store(true)
		case reused.Load() && what == "sync wal/":
			first.kill()
		}
		return nil
	}
	o := opts
	o.FS = lifeFS{FS: mem, life: first}
	l := open(t, "wal", o)
	big := []byte(strings.Repeat("x", 300))
	acked := -1
	for i := 0; i < 200 && !first.killed.Load(); i++ {
		off, err := l.Append(ctx, "s", 0, [][]byte{big})
		if err != nil {
			if first.killed.Load() {
				break
			}
			t.Fatal(err)
		}
		acked = int(off)
		// Everything but the last page is sealed, so sealed segments go to the pool.
		if err := l.TruncateThrough("s", 0, off); err != nil && !first.killed.Load() {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // the flusher recycles what was dropped
	}
	if !first.killed.Load() {
		t.Fatal("no rotation reused a pooled file")
	}
	l.Close()

	// The next life: the power loss comes when it makes a segment of its own.
	second := &life{}
	var crashed *vfs.MemFS
	second.before = func(what string) error {
		if crashed == nil && (strings.HasPrefix(what, "create wal/0") || strings.HasPrefix(what, "reuse ")) {
			crashed = mem.CrashClone(vfs.CrashCloneCfg{})
			second.kill()
		}
		return nil
	}
	o.FS = lifeFS{FS: mem, life: second}
	if l, err := Open("wal", o); err == nil {
		l.Close()
	}
	if crashed == nil {
		t.Fatal("the second life made no segment")
	}

	o.FS = crashed
	l, err := Open("wal", o)
	if err != nil {
		t.Fatalf("open after the power loss (acknowledged through offset %d): %v", acked, err)
	}
	defer l.Close()
	if next := l.Info("s").Next; next <= uint64(acked) {
		t.Fatalf("after the power loss the shard ends at %d, acknowledged through offset %d", next, acked)
	}
	if got := readAll(t, l, "s", uint64(acked)); len(got) != 1 || string(got[0]) != string(big) {
		t.Fatalf("the last acknowledged record reads back as %d records", len(got))
	}
}
