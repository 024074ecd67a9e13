package wal

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestHuntTmpTiming(t *testing.T) {
	var c atomic.Int64
	st := time.Now()
	pointWorkload(t, pointFS{FS: vfs.NewCrashableMem(), n: &c}, 1, nil)
	t.Log(time.Since(st))
	st = time.Now()
	l, _ := Open("x", Options{FS: vfs.NewCrashableMem()})
	l.Close()
	t.Log(time.Since(st))
}
