// Package local is a substrate driver on a directory of the local file system.
//
// Layout under the root directory, which the driver owns:
//
//	objects/   one file per object; key segment s is the file "f.s" (the object)
//	           or the directory "d.s" (keys that continue past s), so that "a"
//	           and "a/b" can both exist, as on an object store
//	tmp/       writes in progress; renamed into objects/ when complete
//	locks/     lock files that serialise conditional writes across processes
//
// Each object file starts with a header that carries its version, so the version
// changes atomically with the bytes:
//
//	+-------------+--------------------+------------------+
//	| magic "l0o1" | version (16 bytes) | object bytes ... |
//	+-------------+--------------------+------------------+
//
// A version is 16 random bytes, so it is never reused, not even after a delete.
//
// Writes are atomic and durable: the bytes go to a temp file that is fsynced, renamed
// over the object's file, and the object's directory is fsynced before Put returns.
// Conditional writes, unconditional writes and deletes of one key hold a lock (a mutex
// for this process, flock(2) for others sharing the root) from the condition check to
// the rename, so a check and its write are never split by another write.
//
// New creates a missing root, as creating a bucket would. A root (or its objects/)
// removed under an open driver is a missing bucket: every call then fails with
// substrate.ErrBucketNotFound, and no write recreates it.
package local

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/l0store/l0/substrate"
)

var (
	_ substrate.Driver       = (*Driver)(nil)
	_ substrate.WriterDriver = (*Driver)(nil)
)

// The object file format.
const (
	magic      = "l0o1"
	versionLen = 16
	headerLen  = len(magic) + versionLen

	filePrefix = "f."
	dirPrefix  = "d."

	lockStripes = 16
	// staleTemp is the age after which a temp file is taken for a crashed write's
	// leftover and removed at open.
	staleTemp = time.Hour
)

// ErrCorrupt reports an object file whose header is not this driver's.
var ErrCorrupt = errors.New("local: corrupt object file")

// Driver stores objects as files under a root directory.
type Driver struct {
	root    string
	objects string
	tmp     string
	locks   [lockStripes]stripe
}

type stripe struct {
	mu   sync.Mutex
	file *os.File
}

// New opens (creating it if needed) the store rooted at dir.
func New(dir string) (*Driver, error) {
	d := &Driver{
		root:    dir,
		objects: filepath.Join(dir, "objects"),
		tmp:     filepath.Join(dir, "tmp"),
	}
	for _, sub := range []string{d.objects, d.tmp, filepath.Join(dir, "locks")} {
		if err := mkdirAllSync(sub); err != nil {
			return nil, fmt.Errorf("local %s: %w", dir, err)
		}
	}
	for i := range d.locks {
		f, err := os.OpenFile(filepath.Join(dir, "locks", fmt.Sprintf("%02d", i)), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("local %s: %w", dir, err)
		}
		d.locks[i].file = f
	}
	d.removeStaleTemps()
	return d, nil
}

// removeStaleTemps removes what crashed writes left in tmp/. Recent files may belong to
// another process's write in progress, so only old ones go.
func (d *Driver) removeStaleTemps() {
	entries, _ := os.ReadDir(d.tmp)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleTemp {
			_ = os.Remove(filepath.Join(d.tmp, e.Name()))
		}
	}
}

// path maps a key to its object file. It validates the key itself so that no caller,
// not even one that bypasses substrate.Bucket, can reach outside the root.
func (d *Driver) path(key string) (string, error) {
	if err := substrate.ValidateKey(key); err != nil {
		return "", err
	}
	segs := strings.Split(key, "/")
	for i, s := range segs[:len(segs)-1] {
		segs[i] = dirPrefix + s
	}
	segs[len(segs)-1] = filePrefix + segs[len(segs)-1]
	return filepath.Join(d.objects, filepath.Join(segs...)), nil
}

func (d *Driver) lock(key string) func() {
	h := fnv.New32a()
	h.Write([]byte(key))
	s := &d.locks[h.Sum32()%lockStripes]
	s.mu.Lock()
	for {
		err := syscall.Flock(int(s.file.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	return func() {
		_ = syscall.Flock(int(s.file.Fd()), syscall.LOCK_UN)
		s.mu.Unlock()
	}
}

// Put implements substrate.Driver.
func (d *Driver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	// Written and synced outside the key's lock (NewWriter, then the body); only
	// the check and the rename (Commit) take it.
	w, err := d.NewWriter(ctx, key, cond)
	if err != nil {
		return substrate.Attrs{}, err
	}
	if _, err := io.Copy(w, body); err != nil {
		w.Abort()
		return substrate.Attrs{}, fmt.Errorf("write body: %w", err)
	}
	return w.Commit(ctx)
}

// publish makes the synced temporary file tmp the object under key (at path), if
// cond holds.
func (d *Driver) publish(ctx context.Context, key, path, tmp string, version substrate.Version, size int64, cond substrate.Condition) (substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	unlock := d.lock(key)
	err := d.checkLocked(path, cond)
	if err == nil {
		if err = d.mkdirObjects(filepath.Dir(path)); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	unlock()
	if err != nil {
		return substrate.Attrs{}, err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return substrate.Attrs{}, err
	}
	return substrate.Attrs{Key: key, Size: size, Version: version, Modified: time.Now()}, nil
}

func (d *Driver) checkLocked(path string, cond substrate.Condition) error {
	switch {
	case cond.IfAbsent:
		if _, err := os.Lstat(path); err == nil {
			return substrate.ErrPreconditionFailed
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	case cond.IfMatch != "":
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return d.missing(substrate.ErrPreconditionFailed)
		} else if err != nil {
			return err
		}
		defer f.Close()
		cur, err := readHeader(f, path)
		if err != nil {
			return err
		}
		if cur != cond.IfMatch {
			return substrate.ErrPreconditionFailed
		}
	}
	return nil
}

// createTemp creates a temporary object file under a new version, its header
// written.
func (d *Driver) createTemp() (*os.File, substrate.Version, error) {
	f, err := os.CreateTemp(d.tmp, "put-")
	if err != nil {
		return nil, "", err
	}
	var raw [versionLen]byte
	rand.Read(raw[:])
	if _, err := f.Write(append([]byte(magic), raw[:]...)); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, "", err
	}
	return f, substrate.Version(hex.EncodeToString(raw[:])), nil
}

// Streams reports that NewWriter works.
func (d *Driver) Streams() bool { return true }

// NewWriter starts an object written straight into the temporary file that
// becomes it at Commit: its bytes are written once, and their writeback starts
// every writebackEvery bytes, so that the sync at Commit has only the last stretch
// to wait for.
func (d *Driver) NewWriter(ctx context.Context, key string, cond substrate.Condition) (substrate.DriverWriter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, version, err := d.createTemp()
	if errors.Is(err, fs.ErrNotExist) {
		return nil, d.missing(err)
	} else if err != nil {
		return nil, err
	}
	return &writer{d: d, key: key, path: path, cond: cond, f: f, version: version}, nil
}

// writebackEvery is how many bytes of an object written over time are written
// before their writeback to the disk is started.
const writebackEvery = 1 << 20

// writer is an object being written by NewWriter.
type writer struct {
	d          *Driver
	key, path  string
	cond       substrate.Condition
	f          *os.File
	version    substrate.Version
	size, sent int64 // written, and written back from the body's start
}

func (w *writer) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.wrote(int64(n))
	return n, err
}

// ReadFrom lets a put's body from a file reach the file system's own copy.
func (w *writer) ReadFrom(r io.Reader) (int64, error) {
	n, err := w.f.ReadFrom(r)
	w.wrote(n)
	return n, err
}

// wrote counts n bytes more and starts the writeback of each writebackEvery.
func (w *writer) wrote(n int64) {
	w.size += n
	if w.size-w.sent >= writebackEvery {
		startWriteback(w.f, int64(headerLen)+w.sent, w.size-w.sent)
		w.sent = w.size
	}
}

func (w *writer) Commit(ctx context.Context) (substrate.Attrs, error) {
	tmp := w.f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	err := w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return substrate.Attrs{}, err
	}
	return w.d.publish(ctx, w.key, w.path, tmp, w.version, w.size, w.cond)
}

func (w *writer) Abort() {
	w.f.Close()
	os.Remove(w.f.Name())
}

func readHeader(f *os.File, path string) (substrate.Version, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(f, h[:]); err != nil || !bytes.Equal(h[:len(magic)], []byte(magic)) {
		return "", fmt.Errorf("%s: %w", path, ErrCorrupt)
	}
	return substrate.Version(hex.EncodeToString(h[len(magic):])), nil
}

// open opens the object file and reads its header.
func (d *Driver) open(ctx context.Context, key string) (*os.File, substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return nil, substrate.Attrs{}, err
	}
	path, err := d.path(key)
	if err != nil {
		return nil, substrate.Attrs{}, err
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, substrate.Attrs{}, d.missing(substrate.ErrNotFound)
	} else if err != nil {
		return nil, substrate.Attrs{}, err
	}
	info, err := f.Stat()
	if err == nil && !info.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file: %w", path, ErrCorrupt)
	}
	var version substrate.Version
	if err == nil {
		version, err = readHeader(f, path)
	}
	if err != nil {
		f.Close()
		return nil, substrate.Attrs{}, err
	}
	return f, substrate.Attrs{Key: key, Size: info.Size() - int64(headerLen), Version: version, Modified: info.ModTime()}, nil
}

// NewRangeReader implements substrate.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	f, attrs, err := d.open(ctx, key)
	if err != nil {
		return nil, err
	}
	if off >= attrs.Size && !(off == 0 && length < 0) {
		f.Close()
		return nil, fmt.Errorf("offset %d of %d bytes: %w", off, attrs.Size, substrate.ErrInvalidRange)
	}
	n := attrs.Size - off
	if length >= 0 && length < n {
		n = length
	}
	return &reader{SectionReader: io.NewSectionReader(f, int64(headerLen)+off, n), file: f, attrs: attrs}, nil
}

// Attributes implements substrate.Driver.
func (d *Driver) Attributes(ctx context.Context, key string) (substrate.Attrs, error) {
	f, attrs, err := d.open(ctx, key)
	if err != nil {
		return substrate.Attrs{}, err
	}
	f.Close()
	return attrs, nil
}

// Delete implements substrate.Driver. Directories left empty stay; listings skip them.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path, err := d.path(key)
	if err != nil {
		return err
	}
	unlock := d.lock(key)
	err = os.Remove(path)
	unlock()
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return d.missing(nil)
	} else if err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// Close implements substrate.Driver.
func (d *Driver) Close() error {
	var errs []error
	for i := range d.locks {
		if f := d.locks[i].file; f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

type reader struct {
	*io.SectionReader
	file  *os.File
	attrs substrate.Attrs
}

func (r *reader) Close() error           { return r.file.Close() }
func (r *reader) Attrs() substrate.Attrs { return r.attrs }

// missing returns err, the answer for a key that is not there, if the store itself is
// there, and ErrBucketNotFound if it is not. Only a missing file pays for the check,
// one stat, so that a removed root never reads as an empty store.
func (d *Driver) missing(err error) error {
	if _, serr := os.Stat(d.objects); errors.Is(serr, fs.ErrNotExist) || errors.Is(serr, syscall.ENOTDIR) {
		return fmt.Errorf("local %s: %w", d.root, substrate.ErrBucketNotFound)
	}
	return err
}

// mkdirObjects creates dir, a directory under objects/, and its missing parents up to
// objects/ itself, which it never creates: a removed store stays removed instead of
// coming back with one object in it.
func (d *Driver) mkdirObjects(dir string) error {
	if dir == d.objects {
		if _, err := os.Stat(dir); err != nil {
			return d.missing(err)
		}
		return nil
	}
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := d.mkdirObjects(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(filepath.Dir(dir))
}

// mkdirAllSync creates dir and its missing parents, fsyncing each parent after it gains
// an entry, so that a file renamed into dir survives a crash.
func mkdirAllSync(dir string) error {
	if info, err := os.Stat(dir); err == nil {
		if !info.IsDir() {
			return fmt.Errorf("%s: not a directory", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := mkdirAllSync(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(parent)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// List implements substrate.Driver. It walks the tree in key order, descending only
// into directories whose keys can match, and stops after limit keys.
func (d *Driver) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	if _, err := os.Stat(d.objects); err != nil {
		// The walk skips directories that vanish under it; the top one is the store.
		return nil, false, d.missing(err)
	}
	w := walker{ctx: ctx, prefix: prefix, startAfter: startAfter, limit: limit}
	err := w.walk(d.objects, "")
	if errors.Is(err, errWalkDone) {
		return w.entries, true, nil
	}
	return w.entries, false, err
}

var errWalkDone = errors.New("walk done")

type walker struct {
	ctx        context.Context
	prefix     string
	startAfter string
	limit      int
	entries    []substrate.ListEntry
}

// walk visits the directory holding the keys that start with keyPrefix (which is ""
// or ends in '/').
func (w *walker) walk(dir, keyPrefix string) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	// Order entries as their keys sort: an object "x" as "x", a directory "x" as
	// "x/", since every key below it starts with "x/" and so sorts as one block.
	type item struct {
		name, sortKey string
		dir           bool
	}
	items := make([]item, 0, len(des))
	for _, de := range des {
		name := de.Name()
		switch {
		case de.IsDir() && strings.HasPrefix(name, dirPrefix):
			items = append(items, item{name, keyPrefix + name[len(dirPrefix):] + "/", true})
		case !de.IsDir() && strings.HasPrefix(name, filePrefix):
			items = append(items, item{name, keyPrefix + name[len(filePrefix):], false})
		}
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.sortKey, b.sortKey) })
	for _, it := range items {
		key := it.sortKey
		if it.dir {
			// Skip a block that cannot hold a match: no overlap with the prefix, or
			// entirely at or before startAfter.
			overlaps := strings.HasPrefix(key, w.prefix) || strings.HasPrefix(w.prefix, key)
			after := key > w.startAfter || strings.HasPrefix(w.startAfter, key)
			if !overlaps || !after {
				continue
			}
			if err := w.walk(filepath.Join(dir, it.name), key); err != nil {
				return err
			}
			continue
		}
		if !strings.HasPrefix(key, w.prefix) || key <= w.startAfter {
			continue
		}
		if len(w.entries) == w.limit {
			return errWalkDone
		}
		info, err := os.Stat(filepath.Join(dir, it.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted while we walked
		} else if err != nil {
			return err
		}
		w.entries = append(w.entries, substrate.ListEntry{Key: key, Size: info.Size() - int64(headerLen)})
	}
	return nil
}
