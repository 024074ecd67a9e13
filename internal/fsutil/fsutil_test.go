package fsutil

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestReadFileIntoReadsWholeFilesInOneBuffer: a file is read whole, into the
// buffer given when it is large enough, and into a new one sized to it when not;
// a shorter file read after a longer one is only its own bytes.
func TestReadFileIntoReadsWholeFilesInOneBuffer(t *testing.T) {
	fs := vfs.NewMem()
	write := func(name string, data []byte) {
		f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		// A copy: pebble's in-memory files scribble on what they were given once
		// Write returns, in race builds.
		if _, err := f.Write(bytes.Clone(data)); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	long, short := bytes.Repeat([]byte("long"), 100_000), []byte("short")
	write("long", long)
	write("short", short)
	write("empty", nil)

	buf, err := ReadFileInto(fs, "long", nil)
	if err != nil || !bytes.Equal(buf, long) {
		t.Fatalf("long: %d bytes, %v", len(buf), err)
	}
	if cap(buf) > len(long)+1 {
		t.Errorf("a buffer of %d bytes for a file of %d: not sized to it", cap(buf), len(long))
	}
	again, err := ReadFileInto(fs, "short", buf)
	if err != nil || !bytes.Equal(again, short) {
		t.Fatalf("short after long: %q, %v", again, err)
	}
	if &again[0] != &buf[0] {
		t.Error("the short file was not read into the buffer given")
	}
	if empty, err := ReadFileInto(fs, "empty", buf); err != nil || len(empty) != 0 {
		t.Fatalf("empty: %d bytes, %v", len(empty), err)
	}
	if whole, err := ReadFile(fs, "long"); err != nil || !bytes.Equal(whole, long) {
		t.Fatalf("ReadFile: %d bytes, %v", len(whole), err)
	}
	if _, err := ReadFileInto(fs, "missing", nil); err == nil {
		t.Fatal("a missing file read without an error")
	}
}

// TestSyncPathMakesEveryDirectoryAboveDurable: directories made without a sync of
// their parents survive a power loss once SyncPath ran on the deepest.
func TestSyncPathMakesEveryDirectoryAboveDurable(t *testing.T) {
	fs := vfs.NewCrashableMem()
	if err := fs.MkdirAll("a/b/c", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SyncPath(fs, "a/b/c"); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	if _, err := crashed.Stat("a/b/c"); err != nil {
		t.Fatalf("after SyncPath and a power loss: %v", err)
	}
}

// refusingFS refuses to open one directory, as the operating system does a
// directory the process may not read.
type refusingFS struct {
	vfs.FS
	refused string
}

func (f refusingFS) OpenDir(name string) (vfs.File, error) {
	if name == f.refused {
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrPermission}
	}
	return f.FS.OpenDir(name)
}

// TestSyncPathPassesOverAnAncestorItMayNotOpen: a directory above the WAL's that the
// process may not read does not refuse the open; the directories below and above it
// are still synced. The WAL's own directory must be synced, and its refusal is an
// error.
func TestSyncPathPassesOverAnAncestorItMayNotOpen(t *testing.T) {
	mem := vfs.NewCrashableMem()
	if err := mem.MkdirAll("a/b/c", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SyncPath(refusingFS{mem, "a/b"}, "a/b/c"); err != nil {
		t.Fatalf("SyncPath with a/b unreadable: %v", err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	if _, err := crashed.Stat("a"); err != nil {
		t.Fatalf("a, above the unreadable a/b, was not synced: %v", err)
	}
	if err := SyncPath(refusingFS{mem, "a/b/c"}, "a/b/c"); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("SyncPath of an unreadable a/b/c itself: %v, want a permission error", err)
	}
}

// openDirs records the directories opened through it; it wraps the operating
// system's file system, as the WAL's disk-health checks do.
type openDirs struct {
	vfs.FS
	opened []string
}

func (f *openDirs) OpenDir(name string) (vfs.File, error) {
	f.opened = append(f.opened, name)
	return f.FS.OpenDir(name)
}

func (f *openDirs) Unwrap() vfs.FS { return f.FS }

// TestSyncPathOfARelativePathReachesTheRoot: a relative WAL path on the operating
// system's file system, through a wrapper of it, is synced up to "/", not only up
// to the working directory, which may itself be new and unsynced.
func TestSyncPathOfARelativePathReachesTheRoot(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.MkdirAll("wal", 0o755); err != nil {
		t.Fatal(err)
	}
	fs := &openDirs{FS: vfs.Default}
	if err := SyncPath(fs, "wal"); err != nil {
		t.Fatal(err)
	}
	if n := len(fs.opened); n == 0 || fs.opened[n-1] != "/" {
		t.Fatalf("SyncPath of a relative path through a wrapper synced %q, not up to /", fs.opened)
	}
}
