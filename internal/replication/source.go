package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/internal/part"
)

// Source is where an upload reads a part: the local file of a part sealed in this
// process, for the copies its seal queued, or a replica that holds it, for a
// backfill.
type Source struct {
	LocalFile string
	Replica   string // with Key
	Key       string
}

// FromFile is the source of a part sealed in this process.
func FromFile(path string) Source { return Source{LocalFile: path} }

// FromReplica is the source of a part that replica holds under key.
func FromReplica(replica, key string) Source { return Source{Replica: replica, Key: key} }

func (s Source) String() string {
	if s.LocalFile != "" {
		return "file " + s.LocalFile
	}
	return "replica " + s.Replica + " key " + s.Key
}

// open returns the part as a verified local file, read from the start.
func (u *Uploader) open(ctx context.Context, j Job) (*io.SectionReader, func(), error) {
	if j.Source.LocalFile != "" {
		f, err := u.fs.Open(j.Source.LocalFile)
		if err != nil {
			return nil, nil, fmt.Errorf("replication: upload %s from %s: %w", j.Key, j.Source, err)
		}
		if err := verify(whole(f), j); err != nil {
			f.Close()
			return nil, nil, err
		}
		return io.NewSectionReader(f, 0, j.Size), func() { f.Close() }, nil
	}
	src, ok := u.set.Get(j.Source.Replica)
	if !ok {
		return nil, nil, fmt.Errorf("replication: upload %s: no source replica %q", j.Key, j.Source.Replica)
	}
	r, err := src.Bucket.NewRangeReader(ctx, j.Source.Key, 0, -1)
	if err != nil {
		return nil, nil, fmt.Errorf("replication: upload %s from %s: %w", j.Key, j.Source, err)
	}
	defer r.Close()
	f, path, err := fsutil.CreateTemp(u.fs, u.opts.TempDir, "upload-", ".part")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { f.Close(); u.fs.Remove(path) }
	if _, err := io.Copy(f, r); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("replication: upload %s from %s: %w", j.Key, j.Source, err)
	}
	if err := verify(whole(f), j); err != nil {
		cleanup()
		return nil, nil, err
	}
	return io.NewSectionReader(f, 0, j.Size), cleanup, nil
}

// whole reads all of f, however long.
func whole(f vfs.File) io.Reader { return io.NewSectionReader(f, 0, math.MaxInt64) }

// verify reads r whole and checks the part's size and part CRC.
func verify(r io.Reader, j Job) error {
	n, crc, err := part.Checksum(r, j.Size)
	if err != nil {
		return fmt.Errorf("replication: verify %s from %s: %w", j.Key, j.Source, err)
	}
	if n != j.Size || crc != j.CRC {
		return fmt.Errorf("replication: %s from %s: %d bytes with CRC %08x, want %d bytes with CRC %08x: %w",
			j.Key, j.Source, n, crc, j.Size, j.CRC, ErrCorruptSource)
	}
	return nil
}

// ErrCorruptSource reports a source whose copy of a part fails its checks.
var ErrCorruptSource = errors.New("replication: corrupt source")

// CleanDir removes the temporary files of uploads a crash interrupted.
func CleanDir(fsys vfs.FS, dir string) error {
	return fsutil.RemoveMatching(fsys, dir, "upload-*.part")
}
