package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/s3"
)

// The tests build a store by running an engine on two replicas, a directory and
// a bucket on fake-gcs-server (a process), and run l0ctl on it in this process.
// l0ctl reaches the emulator as an operator would, through
// STORAGE_EMULATOR_HOST.
var (
	gcsOnce   sync.Once
	gcsServer *emulator.GCS
	gcsErr    error
	gcsNames  atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if gcsServer != nil {
		gcsServer.Stop()
	}
	os.Exit(code)
}

// s3Bucket creates a bucket on versitygw, started as a process, and points
// l0ctl at it through the AWS SDK's environment variables, for this test.
func s3Bucket(t *testing.T) (*substrate.Bucket, string) {
	t.Helper()
	srv, err := emulator.StartS3Process()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	t.Setenv("AWS_ENDPOINT_URL", srv.Endpoint)
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_REGION", "us-east-1")
	name := fmt.Sprintf("l0ctl-%d", time.Now().UnixNano())
	ctx := context.Background()
	d, err := s3.Open(ctx, s3.Config{Bucket: name, Endpoint: srv.Endpoint, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client().CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: &name}); err != nil {
		t.Fatal(err)
	}
	b, err := substrate.New(d, substrate.Options{Name: "s3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, name
}

// gcsBucket creates a bucket on the emulator and returns it with its name.
func gcsBucket(t *testing.T) (*substrate.Bucket, string) {
	t.Helper()
	gcsOnce.Do(func() {
		if gcsServer, gcsErr = emulator.StartGCSProcess(); gcsErr == nil {
			host := strings.TrimSuffix(strings.TrimPrefix(gcsServer.Endpoint, "http://"), "/storage/v1/")
			gcsErr = os.Setenv("STORAGE_EMULATOR_HOST", host)
		}
	})
	if gcsErr != nil {
		t.Fatal(gcsErr)
	}
	name := fmt.Sprintf("l0ctl-%d-%d", time.Now().UnixNano(), gcsNames.Add(1))
	d, err := gcsServer.NewDriver(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := substrate.New(d, substrate.Options{Name: "gcs"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, name
}

// dirBucket opens a directory replica in a new temporary directory.
func dirBucket(t *testing.T, name string) (*substrate.Bucket, string) {
	t.Helper()
	dir := t.TempDir()
	d, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := substrate.New(d, substrate.Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, dir
}

// testStore is a store an engine wrote: replica "local" (a directory, the
// authority) and, unless built without, replica "gcs".
type testStore struct {
	local, gcs, s3  *substrate.Bucket
	dir             string // local's
	gcsName, s3Name string
}

// flags are the -replica flags that name the store's replicas.
func (s *testStore) flags() []string {
	f := []string{"-replica", "local=dir://" + s.dir}
	if s.gcs != nil {
		f = append(f, "-replica", "gcs=gcs://"+s.gcsName)
	}
	if s.s3 != nil {
		f = append(f, "-replica", "s3=s3://"+s.s3Name)
	}
	return f
}

// specs are the engine's replicas.
func (s *testStore) specs() []replica.Spec {
	specs := []replica.Spec{{Name: "local", Domain: "node", Bucket: s.local}}
	if s.gcs != nil {
		specs = append(specs, replica.Spec{Name: "gcs", Domain: "gcp", Bucket: s.gcs})
	}
	if s.s3 != nil {
		specs = append(specs, replica.Spec{Name: "s3", Domain: "aws", Bucket: s.s3})
	}
	return specs
}

// newStore is an empty store on a directory and, withGCS, a GCS bucket.
func newStore(t *testing.T, withGCS bool) *testStore {
	s := &testStore{}
	s.local, s.dir = dirBucket(t, "local")
	if withGCS {
		s.gcs, s.gcsName = gcsBucket(t)
	}
	return s
}

// options are an engine's on the store, as instance, sealing only when told.
func (s *testStore) options(t *testing.T, instance string) engine.Options {
	return engine.Options{
		Dir: t.TempDir(), Replicas: s.specs(), Instance: instance,
		Seal:   seal.Options{SizeBytes: 1 << 40, WALBytes: 1 << 40, Age: time.Hour, Interval: 20 * time.Millisecond},
		Upload: replica.Options{BackoffMin: 5 * time.Millisecond, Attempts: 3},
	}
}

// sealedStore is a store whose shards s1, s2, s3 each sealed three parts on
// every replica and were closed, by an engine that closed too.
func sealedStore(t *testing.T, withGCS bool) *testStore {
	t.Helper()
	s := newStore(t, withGCS)
	writeSealed(t, s)
	return s
}

// writeSealed has an engine write shards s1, s2, s3 on s, three parts each, and
// close them and itself.
func writeSealed(t *testing.T, s *testStore) {
	t.Helper()
	ctx := context.Background()
	e, err := engine.Open(ctx, s.options(t, "writer"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s1", "s2", "s3"} {
		sh, err := e.OpenShard(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for p := range 3 {
			appendN(t, sh, 5, fmt.Sprintf("%s-p%d", id, p))
			if _, err := sh.Seal(ctx, 1<<30); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.FlushAndWaitUploads(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sh.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// appendN appends n records to sh, one batch.
func appendN(t *testing.T, sh *shard.Shard, n int, prefix string) {
	t.Helper()
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = fmt.Appendf(nil, "%s-%d", prefix, i)
	}
	if _, err := sh.Append(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
}

// l0ctl runs l0ctl with args and returns its exit status and output.
func l0ctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	t.Logf("l0ctl %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// contains fails the test unless s contains every one of want, in which runs of
// spaces (a table's alignment) match any run of spaces.
func contains(t *testing.T, what, s string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(squeeze(s), squeeze(w)) {
			t.Errorf("%s does not say %q:\n%s", what, w, s)
		}
	}
}

// squeeze replaces each run of spaces in s with one.
func squeeze(s string) string {
	var b strings.Builder
	for i, c := range s {
		if c == ' ' && i > 0 && s[i-1] == ' ' {
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}
