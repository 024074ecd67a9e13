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
package gcs

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"

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
	owned  bool
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
	return &Driver{client: client, bucket: client.Bucket(bucket)}
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
		return substrate.Attrs{}, classify(err)
	}
	if err := w.Close(); err != nil {
		return substrate.Attrs{}, classify(err)
	}
	return attrsOf(w.Attrs()), nil
}

// NewRangeReader implements substrate.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := d.bucket.Object(key).NewRangeReader(ctx, off, length)
	if err != nil {
		return nil, classify(err)
	}
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
		return substrate.Attrs{}, classify(err)
	}
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
			return entries, false, nil
		}
		if err != nil {
			return nil, false, classify(err)
		}
		if a.Name == startAfter {
			continue
		}
		entries = append(entries, substrate.ListEntry{Key: a.Name, Size: a.Size})
	}
	return entries, true, nil
}

// Delete implements substrate.Driver.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := d.bucket.Object(key).Delete(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil
	}
	return classify(err)
}

// Close implements substrate.Driver.
func (d *Driver) Close() error {
	if d.owned {
		return d.client.Close()
	}
	return nil
}

// classify maps the client's errors onto the substrate sentinels. A missing bucket
// stays a plain error: reading it as a missing object would make a misconfigured
// store look empty.
func classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("%w: %v", substrate.ErrNotFound, err)
	}
	var gerr *googleapi.Error
	if errors.As(err, &gerr) {
		switch gerr.Code {
		case http.StatusPreconditionFailed:
			return fmt.Errorf("%w: %v", substrate.ErrPreconditionFailed, err)
		case http.StatusRequestedRangeNotSatisfiable:
			return fmt.Errorf("%w: %v", substrate.ErrInvalidRange, err)
		case http.StatusNotFound:
			if !strings.Contains(strings.ToLower(gerr.Message), "bucket") {
				return fmt.Errorf("%w: %v", substrate.ErrNotFound, err)
			}
		}
	}
	return err
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
