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
