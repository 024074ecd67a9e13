package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/substratetest"
)

// partFileFS counts the part files created in the engine's directory, and fails
// reads of files opened while failReads is set.
type partFileFS struct {
	vfs.FS
	created   *atomic.Int64
	failReads *atomic.Bool
}

func (fs partFileFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return f, err
	}
	return failingReads{File: f, fail: fs.failReads}, nil
}

type failingReads struct {
	vfs.File
	fail *atomic.Bool
}

func (f failingReads) ReadAt(p []byte, off int64) (int, error) {
	if f.fail.Load() {
		return 0, errors.New("injected read failure")
	}
	return f.File.ReadAt(p, off)
}

func (fs partFileFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if strings.HasSuffix(name, ".part") {
		fs.created.Add(1)
	}
	return fs.FS.Create(name, c)
}

// With one replica that streams (a local directory), no replica needs a copy of a
// part, so a seal writes it once, straight into the replica: no part file in the
// engine's directory. A seal that fails after it began writing leaves nothing in
// the replica, neither the object nor its temporary file, and the next one seals
// the same records.
func TestAPartNoOtherReplicaNeedsIsWrittenOnceStraightIntoTheReplica(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	drv, err := local.New(root)
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(drv, 1)
	var partFiles atomic.Int64
	var failReads atomic.Bool
	e := open(t, Options{Dir: t.TempDir(), FS: partFileFS{FS: vfs.Default, created: &partFiles, failReads: &failReads},
		Bucket: substratetest.NewBucket(t, "local", fd), Seal: quietSealOptions()})
	sh := openShard(t, e, "s")
	want := appendBatches(t, sh, 50)

	nothingLeft := func(when string) {
		t.Helper()
		temps, err := os.ReadDir(filepath.Join(root, "tmp"))
		if err != nil {
			t.Fatal(err)
		}
		var parts int
		for _, err := range e.opts.Bucket.ListAll(ctx, "shards/s/parts/") {
			if err != nil {
				t.Fatal(err)
			}
			parts++
		}
		if len(temps) != 0 || parts != 0 {
			t.Fatalf("after %s: %d temporary files and %d parts in the replica", when, len(temps), parts)
		}
	}
	// The WAL fails under the seal, as it writes the part.
	failReads.Store(true)
	if _, err := sh.Seal(ctx, 1<<40); err == nil {
		t.Fatal("a seal whose pages cannot be read succeeded")
	}
	failReads.Store(false)
	nothingLeft("a seal whose pages could not be read")
	// The replica fails the object's write.
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^shards/s/parts/", Nth: 1, Err: fault.ErrInjected})
	if _, err := sh.Seal(ctx, 1<<40); err == nil {
		t.Fatal("a seal whose put fails succeeded")
	}
	nothingLeft("a seal whose put failed")

	fd.SetRules()
	res, err := sh.Seal(ctx, 1<<40)
	if err != nil || res.Records != uint64(len(want)) {
		t.Fatalf("seal: %+v %v", res, err)
	}
	if n := partFiles.Load(); n != 0 {
		t.Fatalf("%d part files created in the engine's directory", n)
	}
	if n := sh.Info().UnsealedBytes; n != 0 {
		t.Fatalf("%d bytes unsealed", n)
	}
	if got := readAll(t, sh, 0); !equal(got, want) {
		t.Fatalf("read back %d records of %d", len(got), len(want))
	}
}
