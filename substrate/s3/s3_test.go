package s3_test

import (
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
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// TestConformance runs the suite against versitygw started as a process with its
// posix backend, or the server at L0_S3_ENDPOINT.
func TestConformance(t *testing.T) {
	srv, err := emulator.StartS3Process()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	substratetest.RunConformance(t, harness(srv))
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
	return func(t testing.TB) substrate.Driver {
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
}
