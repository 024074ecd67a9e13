// Package gcs is a substrate driver on Google Cloud Storage through
// cloud.google.com/go/storage.
//
// Versions are object generations. Put-if-absent is a write with the DoesNotExist
// precondition (ifGenerationMatch=0) and compare-and-swap a write with
// GenerationMatch: both are decided by the server atomically, and the client retries
// them because a precondition makes them idempotent. The driver relies on
// preconditions on uploads only: delete, copy and compose are never conditional here,
// because the emulator the tests run against (fake-gcs-server) ignores preconditions
// on them and a test could not tell a driver that depended on them from a broken one.
//
// The client reports a 404 of an object call the same way whether the object or the
// bucket is missing. The driver answers ErrNotFound only once it knows the bucket
// exists: from any call that succeeded, or else from listing one object. An upload's
// 404 is always checked, and a check that finds the bucket gone forgets it existed.
package gcs

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/l0store/l0/substrate"
)

var _ substrate.Driver = (*Driver)(nil)

const (
	// maxChunk bounds the buffer a write allocates; larger objects are uploaded in
	// resumable chunks of this size.
	maxChunk = 16 << 20
	minChunk = googleapi.MinUploadChunkSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Config says which bucket to use and how to reach it.
type Config struct {
	// Bucket is the bucket's name. Required.
	Bucket string
	// Endpoint is the JSON API's base URL, e.g. "http://127.0.0.1:4443/storage/v1/"
	// for an emulator. Empty means Google's endpoint, or STORAGE_EMULATOR_HOST when
	// that variable is set (the client's own convention).
	Endpoint string
	// ClientOptions are passed to storage.NewClient after the endpoint's.
	ClientOptions []option.ClientOption
}

// Driver stores objects in one GCS bucket.
type Driver struct {
	client *storage.Client
	bucket *storage.BucketHandle
	name   string
	owned  bool
	// bucketExists caches that some call succeeded, or a check found the bucket:
	// the client reports a missing bucket and a missing object alike, and telling
	// them apart costs a request that a read of a missing object (common: the
	// manifest of a new shard) should not pay each time. Any call that finds the
	// bucket missing clears it.
	bucketExists atomic.Bool
}

// Open creates a client for cfg. The Driver owns it and closes it in Close.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("gcs: empty bucket name")
	}
	// JSON reads: the XML read path needs a public host an emulator does not have,
	// and the JSON one serves real GCS just as well.
	opts := []option.ClientOption{storage.WithJSONReads()}
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint), option.WithoutAuthentication())
	}
	opts = append(opts, cfg.ClientOptions...)
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcs: new client: %w", err)
	}
	d := New(client, cfg.Bucket)
	d.owned = true
	return d, nil
}

// New uses a client the caller owns and keeps open after Close.
func New(client *storage.Client, bucket string) *Driver {
	return &Driver{client: client, bucket: client.Bucket(bucket), name: bucket}
}

// Put implements substrate.Driver.
func (d *Driver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	// One pass for the size and the CRC-32C, so that the server verifies the bytes
	// and the chunk buffer fits the object.
	h := crc32.New(castagnoli)
	size, err := io.Copy(h, body)
	if err != nil {
		return substrate.Attrs{}, fmt.Errorf("read body: %w", err)
	}
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		return substrate.Attrs{}, fmt.Errorf("rewind body: %w", err)
	}

	obj := d.bucket.Object(key)
	switch {
	case cond.IfAbsent:
		obj = obj.If(storage.Conditions{DoesNotExist: true})
	case cond.IfMatch != "":
		gen, err := strconv.ParseInt(string(cond.IfMatch), 10, 64)
		if err != nil || gen <= 0 {
			// Not a generation this driver handed out: it cannot be current.
			return substrate.Attrs{}, fmt.Errorf("version %q is not a generation: %w", cond.IfMatch, substrate.ErrPreconditionFailed)
		}
		obj = obj.If(storage.Conditions{GenerationMatch: gen})
	}
	ctx, cancel := context.WithCancel(ctx) // cancelling aborts a write that failed
	defer cancel()
	w := obj.NewWriter(ctx)
	w.ChunkSize = min(max(int(size+1+minChunk-1)/minChunk*minChunk, minChunk), maxChunk)
	w.SendCRC32C = true
	w.CRC32C = h.Sum32()
	if _, err := io.Copy(w, body); err != nil {
		_ = w.Close()
		return substrate.Attrs{}, d.classifyWrite(ctx, err)
	}
	if err := w.Close(); err != nil {
		return substrate.Attrs{}, d.classifyWrite(ctx, err)
	}
	d.found()
	return attrsOf(w.Attrs()), nil
}

// NewRangeReader implements substrate.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := d.bucket.Object(key).NewRangeReader(ctx, off, length)
	if err != nil {
		return nil, d.classify(ctx, err)
	}
	d.found()
	attrs := substrate.Attrs{Key: key, Size: r.Attrs.Size, Version: generation(r.Attrs.Generation), Modified: r.Attrs.LastModified}
	if off >= attrs.Size && !(off == 0 && length < 0) {
		r.Close()
		return nil, fmt.Errorf("offset %d of %d bytes: %w", off, attrs.Size, substrate.ErrInvalidRange)
	}
	return &reader{r: r, attrs: attrs}, nil
}

// Attributes implements substrate.Driver.
func (d *Driver) Attributes(ctx context.Context, key string) (substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	a, err := d.bucket.Object(key).Attrs(ctx)
	if err != nil {
		return substrate.Attrs{}, d.classify(ctx, err)
	}
	d.found()
	return attrsOf(a), nil
}

// List implements substrate.Driver. GCS lists in bytewise order; StartOffset is
// inclusive, so the key equal to startAfter is skipped.
func (d *Driver) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	q := &storage.Query{Prefix: prefix, StartOffset: startAfter}
	if err := q.SetAttrSelection([]string{"Name", "Size"}); err != nil {
		return nil, false, err
	}
	it := d.bucket.Objects(ctx, q)
	it.PageInfo().MaxSize = limit
	var entries []substrate.ListEntry
	for len(entries) < limit {
		a, err := it.Next()
		if err == iterator.Done {
			d.found()
			return entries, false, nil
		}
		if err != nil {
			return nil, false, d.classify(ctx, err)
		}
		if a.Name == startAfter {
			continue
		}
		entries = append(entries, substrate.ListEntry{Key: a.Name, Size: a.Size})
	}
	d.found()
	return entries, true, nil
}

// Delete implements substrate.Driver.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := d.bucket.Object(key).Delete(ctx)
	if err == nil {
		d.found()
		return nil
	}
	err = d.classify(ctx, err)
	if errors.Is(err, substrate.ErrNotFound) {
		return nil // the key is missing, in a bucket that exists
	}
	return err
}

// Close implements substrate.Driver.
func (d *Driver) Close() error {
	if d.owned {
		return d.client.Close()
	}
	return nil
}

// classify maps the client's errors onto the substrate sentinels. The client wraps
// every 404 of an object call in storage.ErrObjectNotExist, also when the bucket is
// the missing part, so a 404 is ErrNotFound only once the bucket is known to exist:
// reading a missing bucket as a missing object would make a misconfigured store look
// like a store of new, empty shards.
func (d *Driver) classify(ctx context.Context, err error) error {
	if errors.Is(err, storage.ErrBucketNotExist) {
		return d.bucketMissing(err)
	}
	if errors.Is(err, storage.ErrObjectNotExist) || statusOf(err) == http.StatusNotFound {
		if d.bucketExists.Load() {
			return fmt.Errorf("%w: %v", substrate.ErrNotFound, err)
		}
		if cerr := d.checkBucket(ctx); cerr != nil {
			return cerr
		}
		return fmt.Errorf("%w: %v", substrate.ErrNotFound, err)
	}
	switch statusOf(err) {
	case http.StatusPreconditionFailed:
		return fmt.Errorf("%w: %v", substrate.ErrPreconditionFailed, err)
	case http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w: %v", substrate.ErrInvalidRange, err)
	}
	return err
}

// classifyWrite classifies the error of an upload. An upload needs no object to
// exist, so its 404 can only be the bucket's; it is rare, so it is checked every
// time rather than answered from the cache, which the check then corrects.
func (d *Driver) classifyWrite(ctx context.Context, err error) error {
	if errors.Is(err, storage.ErrBucketNotExist) {
		return d.bucketMissing(err)
	}
	if statusOf(err) == http.StatusNotFound {
		if cerr := d.checkBucket(ctx); cerr != nil {
			return cerr
		}
		return fmt.Errorf("upload answered 404 in a bucket that exists: %w", err)
	}
	return d.classify(ctx, err)
}

// checkBucket returns nil if the bucket exists, ErrBucketNotFound if it does not, and
// another error if it cannot tell. It lists at most one object rather than read the
// bucket's metadata, because a service account l0 can run under may list objects
// without being allowed to read bucket metadata.
func (d *Driver) checkBucket(ctx context.Context) error {
	q := &storage.Query{}
	if err := q.SetAttrSelection([]string{"Name"}); err != nil {
		return err
	}
	it := d.bucket.Objects(ctx, q)
	it.PageInfo().MaxSize = 1
	_, err := it.Next()
	switch {
	case err == nil || err == iterator.Done:
		d.found()
		return nil
	case errors.Is(err, storage.ErrBucketNotExist) || statusOf(err) == http.StatusNotFound:
		return d.bucketMissing(err)
	}
	return fmt.Errorf("gcs: object or bucket %s missing, and checking the bucket failed: %w", d.name, err)
}

func (d *Driver) bucketMissing(err error) error {
	d.bucketExists.Store(false)
	return fmt.Errorf("gcs bucket %s: %w: %v", d.name, substrate.ErrBucketNotFound, err)
}

// found records that the bucket exists, which every successful call proves.
func (d *Driver) found() {
	if !d.bucketExists.Load() {
		d.bucketExists.Store(true)
	}
}

func statusOf(err error) int {
	var gerr *googleapi.Error
	if errors.As(err, &gerr) {
		return gerr.Code
	}
	return 0
}

func generation(g int64) substrate.Version { return substrate.Version(strconv.FormatInt(g, 10)) }

func attrsOf(a *storage.ObjectAttrs) substrate.Attrs {
	return substrate.Attrs{Key: a.Name, Size: a.Size, Version: generation(a.Generation), Modified: a.Updated}
}

type reader struct {
	r     *storage.Reader
	attrs substrate.Attrs
}

func (r *reader) Read(p []byte) (int, error) { return r.r.Read(p) }
func (r *reader) Close() error               { return r.r.Close() }
func (r *reader) Attrs() substrate.Attrs     { return r.attrs }
