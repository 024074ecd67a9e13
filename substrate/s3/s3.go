// Package s3 is a substrate driver on Amazon S3 and S3-compatible stores through
// aws-sdk-go-v2.
//
// Versions are ETags. Put-if-absent is PutObject with If-None-Match: * and
// compare-and-swap PutObject with If-Match: <etag>; the server decides both
// atomically. An ETag is derived from the content, so an object rewritten with the
// same bytes keeps its ETag: a compare-and-swap can succeed against a version that was
// replaced and then restored byte for byte. The state it swaps from is then identical
// to the one the caller read, and l0's manifests carry a sequence number that makes
// such a restore impossible in practice.
//
// A HEAD has no body, so a HEAD of a missing key and one in a missing bucket both
// answer a bare NotFound. The driver answers ErrNotFound only once it knows the bucket
// exists: from any call that succeeded or a NoSuchKey, or else from a HeadBucket. A
// NoSuchBucket, from any call, makes it forget that the bucket existed.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/l0store/l0/substrate"
)

var _ substrate.Driver = (*Driver)(nil)

// conflictRetries bounds the retries of a conditional write that S3 answered with 409
// ConditionalRequestConflict (another conditional write to the key was in flight).
const conflictRetries = 5

// Config says which bucket to use and how to reach it. Fields left empty come from
// the SDK's usual sources: AWS_ENDPOINT_URL, AWS_REGION, the credential chain.
type Config struct {
	// Bucket is the bucket's name. Required.
	Bucket string
	// Endpoint is the base URL of an S3-compatible server, e.g.
	// "http://127.0.0.1:7070". Setting it also selects path-style addressing.
	Endpoint string
	// Region defaults to AWS_REGION, else "us-east-1".
	Region string
	// AccessKeyID and SecretAccessKey, when both set, are static credentials.
	AccessKeyID     string
	SecretAccessKey string
}

// Driver stores objects in one S3 bucket.
type Driver struct {
	client *s3.Client
	bucket string
	// bucketExists caches that some call succeeded, or HeadBucket found the bucket.
	// A HEAD has no body, so its 404 says "NotFound" whether the key or the bucket is
	// missing, and telling them apart costs a HeadBucket that a HEAD of a missing
	// object (common: the manifest of a new shard) should not pay each time. Any call
	// that finds the bucket missing clears it.
	bucketExists atomic.Bool
}

// Open creates a client for cfg.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3: empty bucket name")
	}
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("s3: load config: %w", err)
	}
	if cfg.Region != "" {
		awsCfg.Region = cfg.Region
	} else if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	if cfg.AccessKeyID != "" && cfg.SecretAccessKey != "" {
		awsCfg.Credentials = credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		// Servers that send no response checksum are common among S3-compatible
		// stores; the SDK would log a line for every such read.
		o.DisableLogOutputChecksumValidationSkipped = true
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			o.UsePathStyle = true
		} else if o.BaseEndpoint != nil {
			o.UsePathStyle = true // AWS_ENDPOINT_URL: an S3-compatible server
		}
	})
	return New(client, cfg.Bucket), nil
}

// New uses a client the caller made.
func New(client *s3.Client, bucket string) *Driver {
	return &Driver{client: client, bucket: bucket}
}

// Put implements substrate.Driver.
func (d *Driver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	size, err := body.Seek(0, io.SeekEnd)
	if err != nil {
		return substrate.Attrs{}, fmt.Errorf("size body: %w", err)
	}
	in := &s3.PutObjectInput{Bucket: &d.bucket, Key: &key, ContentLength: &size}
	switch {
	case cond.IfAbsent:
		in.IfNoneMatch = aws.String("*")
	case cond.IfMatch != "":
		in.IfMatch = aws.String(string(cond.IfMatch))
	}
	for attempt := 0; ; attempt++ {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return substrate.Attrs{}, fmt.Errorf("rewind body: %w", err)
		}
		in.Body = body
		out, err := d.client.PutObject(ctx, in)
		if err == nil {
			d.found()
			return substrate.Attrs{Key: key, Size: size, Version: substrate.Version(aws.ToString(out.ETag)), Modified: time.Now()}, nil
		}
		status := statusOf(err)
		conditional := cond.IfAbsent || cond.IfMatch != ""
		switch {
		case conditional && status == http.StatusConflict && attempt < conflictRetries:
			select {
			case <-time.After(time.Duration(attempt+1) * 20 * time.Millisecond):
				continue
			case <-ctx.Done():
				return substrate.Attrs{}, ctx.Err()
			}
		case status == http.StatusNotFound:
			// A PUT has a response body, but a gateway may still leave out the
			// code: a 404 that does not name the bucket is checked, never assumed.
			if codeOf(err) != "NoSuchBucket" {
				if cerr := d.checkBucket(ctx); cerr != nil {
					return substrate.Attrs{}, cerr
				}
				if cond.IfMatch != "" {
					// If-Match on a missing key: the version the caller read is gone.
					return substrate.Attrs{}, fmt.Errorf("%w: %v", substrate.ErrPreconditionFailed, err)
				}
				return substrate.Attrs{}, fmt.Errorf("put answered 404 in a bucket that exists: %w", err)
			}
		}
		return substrate.Attrs{}, d.classify(ctx, err)
	}
}

// NewRangeReader implements substrate.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	in := &s3.GetObjectInput{Bucket: &d.bucket, Key: &key}
	whole := off == 0 && length < 0
	if !whole {
		r := fmt.Sprintf("bytes=%d-", off)
		if length >= 0 {
			r += strconv.FormatInt(off+length-1, 10)
		}
		in.Range = &r
	}
	out, err := d.client.GetObject(ctx, in)
	if err != nil {
		return nil, d.classify(ctx, err)
	}
	d.found()
	attrs := substrate.Attrs{Key: key, Size: aws.ToInt64(out.ContentLength), Version: substrate.Version(aws.ToString(out.ETag)),
		Modified: aws.ToTime(out.LastModified)}
	if !whole {
		total, ok := totalFromContentRange(aws.ToString(out.ContentRange))
		if !ok {
			out.Body.Close()
			return nil, fmt.Errorf("s3: ranged get of %q: unparseable Content-Range %q", key, aws.ToString(out.ContentRange))
		}
		attrs.Size = total
	}
	return &reader{ReadCloser: out.Body, attrs: attrs}, nil
}

// totalFromContentRange parses the object size out of "bytes 0-9/1000".
func totalFromContentRange(cr string) (int64, bool) {
	i := strings.LastIndexByte(cr, '/')
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(cr[i+1:], 10, 64)
	return n, err == nil
}

// Attributes implements substrate.Driver.
func (d *Driver) Attributes(ctx context.Context, key string) (substrate.Attrs, error) {
	if err := ctx.Err(); err != nil {
		return substrate.Attrs{}, err
	}
	out, err := d.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &d.bucket, Key: &key})
	if err != nil {
		return substrate.Attrs{}, d.classify(ctx, err)
	}
	d.found()
	return substrate.Attrs{Key: key, Size: aws.ToInt64(out.ContentLength), Version: substrate.Version(aws.ToString(out.ETag)),
		Modified: aws.ToTime(out.LastModified)}, nil
}

// List implements substrate.Driver.
func (d *Driver) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	in := &s3.ListObjectsV2Input{Bucket: &d.bucket, Prefix: &prefix, MaxKeys: aws.Int32(int32(limit))}
	if startAfter != "" {
		in.StartAfter = &startAfter
	}
	out, err := d.client.ListObjectsV2(ctx, in)
	if err != nil {
		return nil, false, d.classify(ctx, err)
	}
	d.found()
	entries := make([]substrate.ListEntry, 0, len(out.Contents))
	for _, o := range out.Contents {
		entries = append(entries, substrate.ListEntry{Key: aws.ToString(o.Key), Size: aws.ToInt64(o.Size)})
	}
	return entries, aws.ToBool(out.IsTruncated), nil
}

// Delete implements substrate.Driver.
func (d *Driver) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := d.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &d.bucket, Key: &key})
	if err == nil {
		// S3 answers a delete of a missing key with success, so this proves only
		// that the bucket exists.
		d.found()
		return nil
	}
	err = d.classify(ctx, err)
	if errors.Is(err, substrate.ErrNotFound) {
		return nil // the key is missing, in a bucket that exists
	}
	return err
}

// Close implements substrate.Driver. The SDK's client holds nothing to release.
func (d *Driver) Close() error { return nil }

func statusOf(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

func codeOf(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// classify maps the SDK's errors onto the substrate sentinels. A 404 is ErrNotFound
// only when the bucket is known to exist: reading a missing bucket as a missing object
// would make a misconfigured store look like a store of new, empty shards.
func (d *Driver) classify(ctx context.Context, err error) error {
	switch statusOf(err) {
	case http.StatusNotFound:
		switch codeOf(err) {
		case "NoSuchBucket":
			return d.bucketMissing(err)
		case "NoSuchKey":
			// Only a bucket that exists can say which of its keys it lacks.
			d.found()
			return fmt.Errorf("%w: %v", substrate.ErrNotFound, err)
		}
		// A HEAD's bare "NotFound", or a gateway that names neither.
		if !d.bucketExists.Load() {
			if cerr := d.checkBucket(ctx); cerr != nil {
				return cerr
			}
		}
		return fmt.Errorf("%w: %v", substrate.ErrNotFound, err)
	case http.StatusPreconditionFailed:
		return fmt.Errorf("%w: %v", substrate.ErrPreconditionFailed, err)
	case http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w: %v", substrate.ErrInvalidRange, err)
	}
	return err
}

// checkBucket returns nil if the bucket exists, ErrBucketNotFound if it does not, and
// another error if it cannot tell.
func (d *Driver) checkBucket(ctx context.Context) error {
	_, err := d.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &d.bucket})
	switch {
	case err == nil:
		d.found()
		return nil
	case statusOf(err) == http.StatusNotFound:
		return d.bucketMissing(err)
	}
	return fmt.Errorf("s3: object or bucket %s missing, and checking the bucket failed: %w", d.bucket, err)
}

func (d *Driver) bucketMissing(err error) error {
	d.bucketExists.Store(false)
	return fmt.Errorf("s3 bucket %s: %w: %v", d.bucket, substrate.ErrBucketNotFound, err)
}

// found records that the bucket exists, which every successful call proves.
func (d *Driver) found() {
	if !d.bucketExists.Load() {
		d.bucketExists.Store(true)
	}
}

type reader struct {
	io.ReadCloser
	attrs substrate.Attrs
}

func (r *reader) Attrs() substrate.Attrs { return r.attrs }

// Client returns the SDK client, for administration such as creating the bucket.
func (d *Driver) Client() *s3.Client { return d.client }

// Bucket returns the bucket's name.
func (d *Driver) Bucket() string { return d.bucket }
