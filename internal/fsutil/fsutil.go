// Package fsutil holds small file-system helpers shared by the engine's packages.
package fsutil

import (
	"errors"
	"os"
	"path/filepath"
)

// RemoveMatching removes the files of dir whose names match pattern (filepath.Match
// syntax): the leftovers of work a crash interrupted.
func RemoveMatching(dir, pattern string) error {
	files, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		errs = append(errs, os.Remove(f))
	}
	return errors.Join(errs...)
}

// WriteFileAtomic replaces path with data atomically and durably: a temporary file
// beside it, fsync, rename, fsync of the directory. A crash leaves the old file or
// the new one, and at worst the temporary file.
func WriteFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
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
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
