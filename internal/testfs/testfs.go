// Package testfs holds file-system wrappers for tests and simulations.
package testfs

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// SlowSyncs gives fs's syncs the time d a disk takes, so that a write acknowledged
// before its sync ended has a window to be lost in: on an in-memory file system
// syncs are instant, and a power loss could never fall between a write and its
// sync.
func SlowSyncs(fs vfs.FS, d time.Duration) vfs.FS {
	return errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			time.Sleep(d)
		}
		return nil
	}))
}
