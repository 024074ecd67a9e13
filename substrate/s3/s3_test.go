package s3_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"

	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/s3"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestConformance runs the suite against versitygw started as a process with its
// posix backend, or the server at L0_S3_ENDPOINT.
func TestConformance(t *testing.T) {
	srv, err := emulator.StartS3Process()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunConformance(t, substratetest.Config{
		NewDriver: harness(srv),
		// A bucket name that was never created: the misconfigured store.
		MissingBucket: func(t testing.TB) substrate.Driver {
			d, err := s3.Open(t.Context(), s3.Config{
				Bucket:          fmt.Sprintf("l0-missing-%d", buckets.Add(1)),
				Endpoint:        srv.Endpoint,
				AccessKeyID:     srv.AccessKey,
				SecretAccessKey: srv.SecretKey,
			})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
	})
}

// The driver remembers that its bucket exists, so that a HEAD of a missing object
// costs one request. A bucket deleted later must not stay remembered: the next write
// finds it missing, and from then on HEADs say so too.
func TestABucketDeletedUnderTheDriverIsFoundMissingByTheNextWrite(t *testing.T) {
	srv, err := emulator.StartS3Process()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	ctx := t.Context()
	d := newDriver(t, srv)
	b := substratetest.NewBucket(t, "s3", d)
	if _, err := b.PutBytes(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Attributes(ctx, "missing"); !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("attributes of a missing key in the bucket: %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client().DeleteBucket(ctx, &awss3.DeleteBucketInput{Bucket: aws.String(d.Bucket())}); err != nil {
		t.Fatal(err)
	}
	_, err = b.PutBytes(ctx, "k", []byte("v"))
	if !errors.Is(err, substrate.ErrBucketNotFound) {
		t.Fatalf("put into the deleted bucket: err = %v, want ErrBucketNotFound", err)
	}
	_, err = b.Attributes(ctx, "missing")
	if !errors.Is(err, substrate.ErrBucketNotFound) {
		t.Fatalf("attributes after the put found the bucket missing: err = %v, want ErrBucketNotFound", err)
	}
}

func BenchmarkProcess(b *testing.B) {
	srv, err := emulator.StartS3Process()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunBenchmarks(b, harness(srv))
}

var buckets atomic.Int64

// harness gives each test a fresh bucket.
func harness(srv *emulator.S3) substratetest.Harness {
	return func(t testing.TB) substrate.Driver { return newDriver(t, srv) }
}

// newDriver opens a driver on a bucket it creates.
func newDriver(t testing.TB, srv *emulator.S3) *s3.Driver {
	d, err := s3.Open(t.Context(), s3.Config{
		Bucket:          fmt.Sprintf("l0-conformance-%d", buckets.Add(1)),
		Endpoint:        srv.Endpoint,
		AccessKeyID:     srv.AccessKey,
		SecretAccessKey: srv.SecretKey,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client().CreateBucket(t.Context(), &awss3.CreateBucketInput{Bucket: aws.String(d.Bucket())}); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	return d
}
