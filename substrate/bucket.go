package substrate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultListLimit is the page size of List when ListOptions.Limit is 0, and the
// largest page any backend returns (S3 caps pages at 1000 keys).
const DefaultListLimit = 1000

// Options configure a Bucket.
type Options struct {
	// Name labels the bucket's metrics (the substrate label) and its errors, e.g. the
	// replica name. Default "default".
	Name string
	// Registerer receives the l0_substrate_* metrics. Nil registers nothing; the
	// counts are still kept for Stats. Buckets with different names may share one
	// Registerer.
	Registerer prometheus.Registerer
}

// Bucket is the portable object-store type over a Driver. It is safe for concurrent
// use.
type Bucket struct {
	name    string
	driver  Driver
	metrics *metrics
	closed  atomic.Bool
	close   sync.Once
}

// New wraps d. The Bucket owns d from now on and closes it in Close.
func New(d Driver, opts Options) (*Bucket, error) {
	if opts.Name == "" {
		opts.Name = "default"
	}
	m, err := newMetrics(opts.Name, opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("substrate %s: register metrics: %w", opts.Name, err)
	}
	return &Bucket{name: opts.Name, driver: d, metrics: m}, nil
}

// Name returns the bucket's name from Options.
func (b *Bucket) Name() string { return b.name }

// Stats returns a snapshot of the operation counts.
func (b *Bucket) Stats() Stats { return b.metrics.stats() }

// Put writes body under key unconditionally.
func (b *Bucket) Put(ctx context.Context, key string, body io.ReadSeeker) (Attrs, error) {
	return b.put(ctx, OpPut, key, body, Condition{})
}

// PutIfAbsent writes body under key only if no object exists there. When one does, it
// returns created == false and a nil error, and the existing bytes are untouched.
//
// After an ambiguous failure (the write happened but the caller saw an error) a retry
// reports created == false for the caller's own write: callers whose keys are not
// unique to their content must read the object back to tell the two apart.
func (b *Bucket) PutIfAbsent(ctx context.Context, key string, body io.ReadSeeker) (attrs Attrs, created bool, err error) {
	attrs, err = b.put(ctx, OpPutIfAbsent, key, body, Condition{IfAbsent: true})
	if errors.Is(err, ErrPreconditionFailed) {
		return Attrs{}, false, nil
	}
	return attrs, err == nil, err
}

// Streams reports whether NewWriter works on this bucket.
func (b *Bucket) Streams() bool { return Streams(b.driver) }

// NewWriter starts an object under key whose bytes are written as they are
// produced, and become the object, if cond holds, at Commit: Put without a body
// to hold or read twice. A driver that cannot take a stream is
// errors.ErrUnsupported (see Streams).
func (b *Bucket) NewWriter(ctx context.Context, key string, cond Condition) (*Writer, error) {
	op := OpPut
	switch {
	case cond.IfAbsent:
		op = OpPutIfAbsent
	case cond.IfMatch != "":
		op = OpCompareAndSwap
	}
	if err := b.check(ctx, op, key); err != nil {
		return nil, err
	}
	if !Streams(b.driver) {
		return nil, b.wrap(op, key, errors.ErrUnsupported)
	}
	wd := b.driver.(WriterDriver)
	start := time.Now()
	w, err := wd.NewWriter(ctx, key, cond)
	if err != nil {
		b.metrics.observe(op, start, err)
		return nil, b.wrap(op, key, err)
	}
	return &Writer{b: b, op: op, key: key, w: w, start: start}, nil
}

// Writer is an object being written (see NewWriter). It is not safe for
// concurrent use. Commit or Abort ends it; a commit counts in the metrics as one
// write, from NewWriter to its end, and an abort not at all.
type Writer struct {
	b     *Bucket
	op    Op
	key   string
	w     DriverWriter
	start time.Time
	ended bool
}

// Write adds p to the object.
func (w *Writer) Write(p []byte) (int, error) {
	if w.ended || w.b.closed.Load() {
		return 0, w.b.wrap(w.op, w.key, ErrClosed)
	}
	n, err := w.w.Write(p)
	if err != nil {
		err = w.b.wrap(w.op, w.key, err)
	}
	return n, err
}

// Commit makes the bytes written the object under the key, if the condition
// holds: else ErrPreconditionFailed, and nothing changes.
func (w *Writer) Commit(ctx context.Context) (Attrs, error) {
	if w.ended {
		return Attrs{}, w.b.wrap(w.op, w.key, ErrClosed)
	}
	w.ended = true
	if err := w.b.checkState(ctx, w.op); err != nil {
		w.w.Abort() // refused before the store was asked, as a put is: not counted
		return Attrs{}, err
	}
	attrs, err := w.w.Commit(ctx)
	w.b.metrics.observe(w.op, w.start, err)
	if err != nil {
		return Attrs{}, w.b.wrap(w.op, w.key, err)
	}
	return attrs, nil
}

// Abort drops the object being written; after Commit it does nothing.
func (w *Writer) Abort() {
	if w.ended {
		return
	}
	w.ended = true
	w.w.Abort()
}

// CompareAndSwap replaces the object under key with body only if its current version
// is version. Otherwise, and when the key is missing, it fails with
// ErrPreconditionFailed and changes nothing.
func (b *Bucket) CompareAndSwap(ctx context.Context, key string, version Version, body io.ReadSeeker) (Attrs, error) {
	if version == "" {
		return Attrs{}, fmt.Errorf("substrate %s: compare-and-swap %q: empty version", b.name, key)
	}
	return b.put(ctx, OpCompareAndSwap, key, body, Condition{IfMatch: version})
}

// PutBytes, PutIfAbsentBytes and CompareAndSwapBytes are the byte-slice forms.
func (b *Bucket) PutBytes(ctx context.Context, key string, data []byte) (Attrs, error) {
	return b.Put(ctx, key, bytes.NewReader(data))
}

// PutIfAbsentBytes is PutIfAbsent of a byte slice.
func (b *Bucket) PutIfAbsentBytes(ctx context.Context, key string, data []byte) (Attrs, bool, error) {
	return b.PutIfAbsent(ctx, key, bytes.NewReader(data))
}

// CompareAndSwapBytes is CompareAndSwap of a byte slice.
func (b *Bucket) CompareAndSwapBytes(ctx context.Context, key string, version Version, data []byte) (Attrs, error) {
	return b.CompareAndSwap(ctx, key, version, bytes.NewReader(data))
}

func (b *Bucket) put(ctx context.Context, op Op, key string, body io.ReadSeeker, cond Condition) (Attrs, error) {
	if err := b.check(ctx, op, key); err != nil {
		return Attrs{}, err
	}
	start := time.Now()
	attrs, err := b.driver.Put(ctx, key, body, cond)
	b.metrics.observe(op, start, err)
	if err != nil {
		return Attrs{}, b.wrap(op, key, err)
	}
	return attrs, nil
}

// Get reads the whole object under key.
func (b *Bucket) Get(ctx context.Context, key string) ([]byte, Attrs, error) {
	return b.GetRange(ctx, key, 0, -1)
}

// GetRange reads bytes [off, off+length) of the object under key, clipped to its end
// (any length, up to math.MaxInt64); length < 0 reads to the end. off at or past the
// end is ErrInvalidRange (except a whole read of an empty object), and so are a
// negative off and a zero length. A stream that ends before the clipped range does is
// an error, io.ErrUnexpectedEOF.
func (b *Bucket) GetRange(ctx context.Context, key string, off, length int64) ([]byte, Attrs, error) {
	r, err := b.NewRangeReader(ctx, key, off, length)
	if err != nil {
		return nil, Attrs{}, err
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, Attrs{}, err
	}
	return data, r.Attrs(), nil
}

// NewRangeReader opens bytes [off, off+length) of the object under key for streaming;
// see GetRange. The caller must close the Reader.
func (b *Bucket) NewRangeReader(ctx context.Context, key string, off, length int64) (*Reader, error) {
	if err := b.check(ctx, OpGet, key); err != nil {
		return nil, err
	}
	if off < 0 || length == 0 {
		return nil, b.wrap(OpGet, key, fmt.Errorf("offset %d, length %d: %w", off, length, ErrInvalidRange))
	}
	if length > math.MaxInt64-off {
		// off+length would overflow. No object reaches that far, so the range ends
		// at the object's end, which is what a negative length says to a driver.
		length = -1
	}
	start := time.Now()
	dr, err := b.driver.NewRangeReader(ctx, key, off, length)
	b.metrics.latency(OpGet, start)
	if err != nil {
		b.metrics.count(OpGet, err)
		return nil, b.wrap(OpGet, key, err)
	}
	// The range the driver must deliver, clipped to the object's end. A stream that
	// ends sooner broke off, even if the driver reports a clean end.
	want := dr.Attrs().Size - off
	if length >= 0 && length < want {
		want = length
	}
	return &Reader{b: b, key: key, r: dr, left: max(want, 0)}, nil
}

// Attributes returns the attributes of the object under key.
func (b *Bucket) Attributes(ctx context.Context, key string) (Attrs, error) {
	if err := b.check(ctx, OpAttributes, key); err != nil {
		return Attrs{}, err
	}
	start := time.Now()
	attrs, err := b.driver.Attributes(ctx, key)
	b.metrics.observe(OpAttributes, start, err)
	if err != nil {
		return Attrs{}, b.wrap(OpAttributes, key, err)
	}
	return attrs, nil
}

// Delete removes the object under key. A missing key is not an error.
func (b *Bucket) Delete(ctx context.Context, key string) error {
	if err := b.check(ctx, OpDelete, key); err != nil {
		return err
	}
	start := time.Now()
	err := b.driver.Delete(ctx, key)
	b.metrics.observe(OpDelete, start, err)
	if err != nil {
		return b.wrap(OpDelete, key, err)
	}
	return nil
}

// ListOptions select a page of a listing.
type ListOptions struct {
	// StartAfter resumes a listing after this key: pass the previous page's Next.
	StartAfter string
	// Limit bounds the page; 0 means DefaultListLimit, and larger values are capped
	// to it.
	Limit int
}

// ListPage is one page of a listing.
type ListPage struct {
	Entries []ListEntry
	// Next is the StartAfter of the next page, or "" when the listing is complete.
	Next string
}

// List returns one page of the keys that start with prefix, sorted bytewise. A page is
// empty only when the listing is complete.
func (b *Bucket) List(ctx context.Context, prefix string, opts ListOptions) (ListPage, error) {
	if err := b.checkState(ctx, OpList); err != nil {
		return ListPage{}, err
	}
	if err := validatePrefix(prefix); err != nil {
		return ListPage{}, b.wrap(OpList, prefix, err)
	}
	if opts.StartAfter != "" {
		if err := ValidateKey(opts.StartAfter); err != nil {
			return ListPage{}, b.wrap(OpList, prefix, fmt.Errorf("start after: %w", err))
		}
	}
	if opts.Limit <= 0 || opts.Limit > DefaultListLimit {
		opts.Limit = DefaultListLimit
	}
	// A driver may return an empty page and say more follow (a store that filters a
	// page after cutting it). Such a page must not end the listing, and an empty
	// Next would say it does: ask again, a bounded number of times, since a page
	// resumes only after a key and an empty one carries none.
	for empty := 0; ; empty++ {
		start := time.Now()
		entries, more, err := b.driver.List(ctx, prefix, opts.StartAfter, opts.Limit)
		b.metrics.observe(OpList, start, err)
		if err != nil {
			return ListPage{}, b.wrap(OpList, prefix, err)
		}
		if len(entries) == 0 && more {
			if empty+1 < maxEmptyPages {
				continue
			}
			return ListPage{}, b.wrap(OpList, prefix, fmt.Errorf("%d empty pages after %q, each saying more follow", maxEmptyPages, opts.StartAfter))
		}
		page := ListPage{Entries: entries}
		if more {
			page.Next = entries[len(entries)-1].Key
		}
		return page, nil
	}
}

// maxEmptyPages bounds the empty pages in a row, each saying more keys follow, that
// List asks for before it gives up: a driver that never makes progress must fail the
// listing, not hang it and not end it early.
const maxEmptyPages = 8

// ListAll iterates over every key that starts with prefix, in order, one page at a
// time. It stops after yielding an error.
func (b *Bucket) ListAll(ctx context.Context, prefix string) iter.Seq2[ListEntry, error] {
	return func(yield func(ListEntry, error) bool) {
		var opts ListOptions
		for {
			page, err := b.List(ctx, prefix, opts)
			if err != nil {
				yield(ListEntry{}, err)
				return
			}
			for _, e := range page.Entries {
				if !yield(e, nil) {
					return
				}
			}
			if page.Next == "" {
				return
			}
			opts.StartAfter = page.Next
		}
	}
}

// Close releases the driver. Calls after Close, and a second Close, fail with
// ErrClosed.
func (b *Bucket) Close() error {
	err := fmt.Errorf("substrate %s: %w", b.name, ErrClosed)
	b.close.Do(func() {
		b.closed.Store(true)
		err = b.driver.Close()
	})
	return err
}

func (b *Bucket) check(ctx context.Context, op Op, key string) error {
	if err := b.checkState(ctx, op); err != nil {
		return err
	}
	if err := ValidateKey(key); err != nil {
		return b.wrap(op, key, err)
	}
	return nil
}

func (b *Bucket) checkState(ctx context.Context, op Op) error {
	if b.closed.Load() {
		return fmt.Errorf("substrate %s: %s: %w", b.name, op, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("substrate %s: %s: %w", b.name, op, err)
	}
	return nil
}

func (b *Bucket) wrap(op Op, key string, err error) error {
	return fmt.Errorf("substrate %s: %s %q: %w", b.name, op, key, err)
}

// Reader streams a ranged read. It is not safe for concurrent use, except that Close
// may be called while a Read is blocked, to abort it.
//
// A read is counted in the metrics by how it ended, not by how it opened: an error
// from the stream, or an end before the whole range arrived, counts as a failed get;
// reaching the end of the range, or closing before it without an error, counts as ok.
type Reader struct {
	b    *Bucket
	key  string
	r    DriverReader
	left int64 // bytes of the range not yet delivered
	// counted makes the outcome recorded once, by whichever of the end of the
	// stream, its first error or Close comes first.
	counted atomic.Bool
}

// Read reads the next bytes of the range.
func (r *Reader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.left -= int64(n)
	switch {
	case err == io.EOF && r.left > 0:
		err = fmt.Errorf("stream ended %d bytes before the end of the range: %w", r.left, io.ErrUnexpectedEOF)
	case err == io.EOF:
		r.count(nil)
		return n, io.EOF
	case err == nil:
		return n, nil
	}
	r.count(err)
	return n, r.b.wrap(OpGet, r.key, err)
}

func (r *Reader) count(err error) {
	if r.counted.CompareAndSwap(false, true) {
		r.b.metrics.count(OpGet, err)
	}
}

// Attrs returns the attributes of the object version being read; Size is the whole
// object's size, not the range's.
func (r *Reader) Attrs() Attrs { return r.r.Attrs() }

// Close releases the read.
func (r *Reader) Close() error {
	r.count(nil)
	return r.r.Close()
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
