package substrate

import (
	"context"
	"io"
	"time"
)

// Driver is what a backend implements. The portable Bucket validates keys, checks for
// use after close and a cancelled context, and records metrics before it calls a
// driver, so a driver only talks to its backend and reports failures by wrapping the
// sentinels of this package: ErrNotFound, ErrBucketNotFound, ErrPreconditionFailed,
// ErrInvalidRange. A driver reports ErrNotFound (and treats a delete of a missing key
// as done) only when it knows the bucket exists; when the bucket is missing, every
// call, including Delete and a conditional Put, is ErrBucketNotFound.
// Drivers must be safe for concurrent use.
type Driver interface {
	// Put writes body under key if cond holds, atomically: a reader sees the old
	// object or the new one, never a part of either. A condition that does not hold
	// is ErrPreconditionFailed, including IfMatch on a missing key.
	Put(ctx context.Context, key string, body io.ReadSeeker, cond Condition) (Attrs, error)
	// NewRangeReader opens the object at key for bytes [off, off+length), clipped to
	// the object's end; length < 0 means to the end. The Bucket never passes a
	// length for which off+length overflows. off at or past the end of the object is
	// ErrInvalidRange, except off == 0 with length < 0 (a whole read), which also
	// serves an empty object. The reader's Attrs report the whole object's size: the
	// Bucket takes a stream that ends before the clipped range for a broken one.
	NewRangeReader(ctx context.Context, key string, off, length int64) (DriverReader, error)
	// Attributes returns the object's attributes without its bytes.
	Attributes(ctx context.Context, key string) (Attrs, error)
	// List returns up to limit entries whose keys start with prefix and sort after
	// startAfter (bytewise), in order, and whether more may follow. A driver should
	// return an empty page only at the end of the listing; the Bucket asks again a
	// few times when an empty page says more follow, then fails the listing.
	List(ctx context.Context, prefix, startAfter string, limit int) ([]ListEntry, bool, error)
	// Delete removes the object; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// Close releases the driver's resources.
	Close() error
}

// WriterDriver is a Driver that can also take an object's bytes as they are
// produced, with no body to read again: a local directory writes them straight into
// the file that becomes the object. Optional; the Bucket's Streams reports it.
type WriterDriver interface {
	// Streams reports whether NewWriter works: a driver that wraps another
	// streams only if that one does.
	Streams() bool
	NewWriter(ctx context.Context, key string, cond Condition) (DriverWriter, error)
}

// Streams reports whether d takes objects as streams: a WriterDriver whose
// Streams says so.
func Streams(d Driver) bool {
	wd, ok := d.(WriterDriver)
	return ok && wd.Streams()
}

// DriverWriter is an object being written. Commit makes what was written the object
// under its key if the condition holds, atomically as Put does (the same errors);
// Abort drops it. Nothing is visible under the key before Commit returns, and a
// crash before then leaves nothing there. One of them is called once, last.
type DriverWriter interface {
	io.Writer
	Commit(ctx context.Context) (Attrs, error)
	Abort()
}

// DriverReader is an open ranged read: the bytes and the attributes of the object
// version they come from.
type DriverReader interface {
	io.ReadCloser
	Attrs() Attrs
}

// Condition guards a Put. The zero value is an unconditional write.
type Condition struct {
	// IfAbsent makes the write succeed only if no object exists under the key.
	IfAbsent bool
	// IfMatch makes the write succeed only if the object exists with this version.
	IfMatch Version
}

// Version is the backend's opaque token for one write of an object: a GCS generation,
// an S3 ETag, a local or in-memory generation. Tokens are compared only for equality.
type Version string

// Attrs describes one version of an object.
type Attrs struct {
	Key     string
	Size    int64
	Version Version
	// Modified is the backend's time of the write, where it reports one.
	Modified time.Time
}

// ListEntry is one key of a listing.
type ListEntry struct {
	Key  string
	Size int64
}
