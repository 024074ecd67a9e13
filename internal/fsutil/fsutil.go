// Package fsutil holds small file-system helpers shared by the engine's packages.
// Every one goes through a pebble vfs.FS, so that a test can put the engine on an
// in-memory file system that forgets unsynced writes, or one that fails the i-th
// call.
package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// RemoveMatching removes the files of dir whose names match pattern (filepath.Match
// syntax): the leftovers of work a crash interrupted.
func RemoveMatching(fsys vfs.FS, dir, pattern string) error {
	names, err := fsys.List(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if ok, _ := filepath.Match(pattern, name); ok {
			errs = append(errs, fsys.Remove(fsys.PathJoin(dir, name)))
		}
	}
	return errors.Join(errs...)
}

// CreateTemp creates a new file in dir named prefix, a random part, and suffix, as
// os.CreateTemp does, and returns it with its path.
func CreateTemp(fsys vfs.FS, dir, prefix, suffix string) (vfs.File, string, error) {
	for range 10 {
		var r [8]byte
		rand.Read(r[:])
		path := fsys.PathJoin(dir, prefix+hex.EncodeToString(r[:])+suffix)
		if _, err := fsys.Stat(path); err == nil {
			continue // taken: draw again
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, "", err
		}
		f, err := fsys.Create(path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return nil, "", err
		}
		return f, path, nil
	}
	return nil, "", &fs.PathError{Op: "createtemp", Path: dir, Err: fs.ErrExist}
}

// ReadFile reads the whole file at path.
func ReadFile(fsys vfs.FS, path string) ([]byte, error) { return ReadFileInto(fsys, path, nil) }

// ReadFileInto reads the whole file at path into buf's memory, which it grows to
// the file's size if that is larger, and returns the bytes read. The buffer is
// sized once from the file's size, as os.ReadFile does: grown from nothing, a file
// of tens of megabytes (a WAL segment) was allocated, zeroed and copied several
// times over. A file that is not the size it said is read to its end all the same.
func ReadFileInto(fsys vfs.FS, path string, buf []byte) ([]byte, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := 0
	if info, err := f.Stat(); err == nil {
		size = int(info.Size())
	}
	if cap(buf) < size+1 { // one byte more, to meet the end without growing
		buf = make([]byte, 0, size+1)
	}
	buf = buf[:0]
	for {
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
}

// WriteFileAtomic replaces path with data atomically and durably: a temporary file
// beside it, fsync, rename, fsync of the directory. A crash leaves the old file or
// the new one, and at worst the temporary file.
func WriteFileAtomic(fsys vfs.FS, path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := fsys.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if err := errors.Join(err, f.Close()); err != nil {
		return err
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(fsys, fsys.PathDir(path))
}

// SyncDir makes the entries of dir durable: the files created, renamed or removed
// in it.
func SyncDir(fsys vfs.FS, dir string) error {
	d, err := fsys.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// SyncPath makes dir's name durable, and its entries: it syncs dir and every
// directory above it up to the root. A directory found, not created, may be the
// leftover of a process killed between its mkdir and the sync of its parent:
// nothing else would ever make its name durable, and a power loss, at any later
// time, would take it back with everything in it.
//
// On the operating system's file system (vfs.Default, or a wrapper of it, as the
// WAL's disk-health checks) a relative dir is made absolute first, so that the
// directories above the working directory are synced too (another vfs.FS goes no
// higher than "."). A directory above dir that this process may not open
// (one without read permission, as a home directory of mode 0711) is passed over:
// it cannot be synced from here, and a process that may not read it could not
// have created the directory below it either, unless it could write there.
func SyncPath(fsys vfs.FS, dir string) error {
	if vfs.Root(fsys) == vfs.Default && !filepath.IsAbs(dir) {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		dir = abs
	}
	if err := SyncDir(fsys, dir); err != nil {
		return err
	}
	for {
		parent := fsys.PathDir(dir)
		if parent == dir {
			return nil
		}
		dir = parent
		if err := SyncDir(fsys, dir); err != nil && !errors.Is(err, os.ErrPermission) {
			return err
		}
	}
}

// MkdirAll creates dir and its missing parents, durably: each directory created is
// synced into its parent, so a power loss does not take it back.
func MkdirAll(fsys vfs.FS, dir string) error {
	if _, err := fsys.Stat(dir); err == nil {
		return nil
	}
	if parent := fsys.PathDir(dir); parent != dir {
		if err := MkdirAll(fsys, parent); err != nil {
			return err
		}
	}
	if err := fsys.MkdirAll(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return SyncDir(fsys, fsys.PathDir(dir))
}
