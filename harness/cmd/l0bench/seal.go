package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/klauspost/compress/zstd"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/harness/internal/fakegcs"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/s3"
)

// events returns n synthetic JSON events of about size bytes: the kind of record an
// event log holds, compressible about as real ones are.
func events(n, size int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	kinds := []string{"order.created", "order.paid", "order.shipped", "cart.updated", "user.login"}
	out := make([][]byte, n)
	for i := range out {
		b := fmt.Appendf(nil, `{"id":%d,"kind":%q,"user":"u%05d","amount":%d.%02d,"ts":%d,"tags":[`,
			i, kinds[rng.IntN(len(kinds))], rng.IntN(50000), rng.IntN(1000), rng.IntN(100), 1764400000000+int64(i)*7)
		for len(b) < size-20 {
			b = fmt.Appendf(b, `"t%d",`, rng.IntN(300))
		}
		out[i] = append(b, `"end"]}`...)
	}
	return out
}

// requests is how many requests b has made, of every kind.
func requests(b *substrate.Bucket) uint64 {
	st := b.Stats()
	var n uint64
	for _, op := range substrate.Ops {
		n += st.Total(op)
	}
	return n
}

// localBucket opens a local-directory bucket at dir.
func localBucket(dir string) (*substrate.Bucket, error) {
	d, err := local.New(dir)
	if err != nil {
		return nil, err
	}
	return substrate.New(d, substrate.Options{Name: "local", Registerer: bucketRegisterer()})
}

// remote is the object store the scenarios write their remote replica to: by
// default fake-gcs-server in this process; with -remote gcs and STORAGE_EMULATOR_HOST
// set, that server; with -remote s3, the server at AWS_ENDPOINT_URL (credentials from
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), else versitygw started as a process.
type remote struct {
	kind     string // "gcs" or "s3"
	endpoint string
	stop     func()
	buckets  atomic.Int64
	// for s3
	accessKey, secretKey string
}

// remoteKind is the -remote flag.
var remoteKind = "gcs"

func startGCS() (*remote, error) {
	if remoteKind == "s3" {
		return startS3()
	}
	if host := os.Getenv("STORAGE_EMULATOR_HOST"); host != "" {
		return &remote{kind: "gcs", endpoint: "http://" + host + "/storage/v1/", stop: func() {}}, nil
	}
	srv, err := fakegcs.Start()
	if err != nil {
		return nil, err
	}
	return &remote{kind: "gcs", endpoint: srv.Endpoint, stop: func() { srv.Stop() }}, nil
}

func startS3() (*remote, error) {
	if ep := os.Getenv("AWS_ENDPOINT_URL"); ep != "" {
		return &remote{kind: "s3", endpoint: ep, stop: func() {},
			accessKey: os.Getenv("AWS_ACCESS_KEY_ID"), secretKey: os.Getenv("AWS_SECRET_ACCESS_KEY")}, nil
	}
	srv, err := emulator.StartS3Process()
	if err != nil {
		return nil, fmt.Errorf("-remote s3 without AWS_ENDPOINT_URL starts versitygw (make emulators, then export $(scripts/emulators.sh)): %w", err)
	}
	return &remote{kind: "s3", endpoint: srv.Endpoint, stop: func() { srv.Stop() }, accessKey: srv.AccessKey, secretKey: srv.SecretKey}, nil
}

// newBucket creates a fresh bucket on the remote.
func (g *remote) newBucket(ctx context.Context) (*substrate.Bucket, error) {
	if g.kind == "s3" {
		return g.newS3Bucket(ctx)
	}
	b, _, err := g.newGCSBucket(ctx)
	return b, err
}

// newGCSBucket creates a bucket on the GCS emulator and returns a client of it,
// and its name.
func (g *remote) newGCSBucket(ctx context.Context) (*substrate.Bucket, string, error) {
	name := fmt.Sprintf("l0bench-%d-%d", time.Now().UnixNano(), g.buckets.Add(1))
	d, err := emulator.NewGCSDriver(ctx, g.endpoint, name)
	if err != nil {
		return nil, "", err
	}
	b, err := substrate.New(d, substrate.Options{Name: "gcs", Registerer: bucketRegisterer()})
	return b, name, err
}

// quietSeal never seals on its own: the scenarios decide when.
func quietSeal() seal.Options {
	return seal.Options{SizeBytes: 1 << 40, WALBytes: 1 << 40, Age: time.Hour}
}

// backlog opens an engine in dir on bucket and appends recs to shard id in batches
// of 16.
func backlog(ctx context.Context, dir string, bucket *substrate.Bucket, id string, recs [][]byte) (*engine.Engine, *shard.Shard, error) {
	e, err := engine.Open(ctx, engine.Options{Durability: durability, Dir: dir, Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("backlog")})
	if err != nil {
		return nil, nil, err
	}
	sh, err := e.OpenShard(ctx, id)
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	if err := appendAll(ctx, sh, recs); err != nil {
		e.Close()
		return nil, nil, err
	}
	return e, sh, nil
}

// appendAll appends recs to sh in batches of 16.
func appendAll(ctx context.Context, sh *shard.Shard, recs [][]byte) error {
	for i := 0; i < len(recs); i += 16 {
		if _, err := sh.Append(ctx, recs[i:min(i+16, len(recs))]...); err != nil {
			return err
		}
	}
	return nil
}

// settle waits until e's tail has shipped every page appended, then writes back
// every dirty page of the machine: what the backlog's appends left running must
// not share the disk and cores with the seal measured after them.
func settle(ctx context.Context, e *engine.Engine) error {
	for e.Metrics().TailUnshippedBytes > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	syscall.Sync()
	return nil
}

// runSeal times one seal of recs, appended first, into a part on a local-directory
// bucket.
func runSeal(ctx context.Context, dir string, recs [][]byte) (timed, error) {
	defer os.RemoveAll(dir)
	bucket, err := localBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		return timed{}, err
	}
	defer bucket.Close()
	e, sh, err := backlog(ctx, filepath.Join(dir, "engine"), bucket, "seal", recs)
	if err != nil {
		return timed{}, err
	}
	defer e.Close()
	if err := settle(ctx, e); err != nil {
		return timed{}, err
	}
	return timeIt(func() error {
		res, err := sh.Seal(ctx, 1<<40)
		if err == nil && res.Records != uint64(len(recs)) {
			err = fmt.Errorf("sealed %d records of %d", res.Records, len(recs))
		}
		return err
	})
}

// compressAll compresses recs as the part writer lays them out, in blocks of
// part.DefaultBlockSize, with enc: the seal's work on one core, without the rest.
func compressAll(enc *zstd.Encoder, recs [][]byte) {
	var block, out []byte
	for _, r := range recs {
		block = append(block, r...)
		if len(block) >= part.DefaultBlockSize {
			out = enc.EncodeAll(block, out[:0])
			block = block[:0]
		}
	}
	if len(block) > 0 {
		enc.EncodeAll(block, out[:0])
	}
}

// inherited is one round of the inherited-seal scenario: the open of the shard
// until its backlog was sealed, until OpenShard returned and the object-store
// requests it made, and the direct seal of the same backlog.
type inherited struct {
	open, opened, direct time.Duration
	requests             uint64
}

// runInherited leaves a backlog of recs unsealed (Retire, then close the engine),
// opens a new engine on the same directory and times the open of the shard until
// OpenShard returned and until its backlog is sealed; and, as the baseline, times
// a direct seal of the same backlog on an engine of its own: first, with
// directFirst.
func runInherited(ctx context.Context, dir string, g *remote, recs [][]byte, directFirst bool) (res inherited, err error) {
	defer os.RemoveAll(dir)
	bucket, err := g.newBucket(ctx)
	if err != nil {
		return inherited{}, err
	}
	defer g.discard(ctx, bucket)
	runDirect := func() error {
		e, sh, err := backlog(ctx, filepath.Join(dir, "direct"), bucket, "direct", recs)
		if err != nil {
			return err
		}
		defer e.Close()
		start := time.Now()
		_, err = sh.Seal(ctx, 1<<40)
		res.direct = time.Since(start)
		return err
	}
	if directFirst {
		if err := runDirect(); err != nil {
			return inherited{}, err
		}
	}
	e, sh, err := backlog(ctx, dir, bucket, "moved", recs)
	if err != nil {
		return inherited{}, err
	}
	if err := sh.Retire(ctx); err != nil {
		return inherited{}, err
	}
	if err := e.Close(); err != nil {
		return inherited{}, err
	}
	e, err = engine.Open(ctx, engine.Options{Durability: durability, Dir: dir, Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("inherited")})
	if err != nil {
		return inherited{}, err
	}
	defer e.Close()
	before := requests(bucket)
	start := time.Now()
	sh, err = e.OpenShard(ctx, "moved")
	if err != nil {
		return inherited{}, err
	}
	res.opened, res.requests = time.Since(start), requests(bucket)-before
	for sh.Info().UnsealedBytes > 0 {
		if time.Since(start) > time.Minute {
			return inherited{}, fmt.Errorf("the inherited backlog was not sealed within a minute")
		}
		time.Sleep(time.Millisecond)
	}
	res.open = time.Since(start)
	if !directFirst {
		if err := runDirect(); err != nil {
			return inherited{}, err
		}
	}
	return res, nil
}

// discard deletes every object of b, a bucket of a round that is over, and closes
// it, so that an in-process emulator does not carry every earlier round's objects
// in its heap.
func (g *remote) discard(ctx context.Context, b *substrate.Bucket) {
	defer b.Close()
	for e, err := range b.ListAll(ctx, "") {
		if err != nil {
			return
		}
		b.Delete(ctx, e.Key)
	}
}

func (g *remote) newS3Bucket(ctx context.Context) (*substrate.Bucket, error) {
	name := fmt.Sprintf("l0bench-%d-%d", time.Now().UnixNano(), g.buckets.Add(1))
	d, err := s3.Open(ctx, s3.Config{Bucket: name, Endpoint: g.endpoint, AccessKeyID: g.accessKey, SecretAccessKey: g.secretKey})
	if err != nil {
		return nil, err
	}
	if _, err := d.Client().CreateBucket(ctx, &awss3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", name, err)
	}
	return substrate.New(d, substrate.Options{Name: "s3", Registerer: bucketRegisterer()})
}
