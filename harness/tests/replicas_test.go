package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/s3"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestAnAttachedReplicaIsARecoverableCopyOnlyAfterBackfill is the observed failure end
// to end: a store with a local replica seals 3 parts; a remote replica is attached
// and one more part is sealed. The remote then holds a manifest naming 4 parts and
// the bytes of 1: a cold open from it alone succeeds and its replay fails naming a
// part. After BackfillUnderReplicated and FlushAndWaitUploads it holds 4 parts and
// serves every record alone. The remote is fake-gcs-server as a process, then
// versitygw as a process, both over HTTP.
func TestAnAttachedReplicaIsARecoverableCopyOnlyAfterBackfill(t *testing.T) {
	for _, remote := range []struct {
		name string
		open func(t *testing.T) *substrate.Bucket
	}{
		{"gcs", gcsProcessBucket},
		{"s3", s3ProcessBucket},
	} {
		t.Run(remote.name, func(t *testing.T) {
			attachAndBackfill(t, remote.name, remote.open(t))
		})
	}
}

func attachAndBackfill(t *testing.T, name string, remote *substrate.Bucket) {
	ctx := context.Background()
	dir := t.TempDir()
	local, err := localBucket(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	quiet := seal.Options{SizeBytes: 1 << 40, WALBytes: 1 << 40, Age: time.Hour}
	localOnly := []replica.Spec{{Name: "local", Domain: "node", Bucket: local}}
	both := append(slices.Clone(localOnly), replica.Spec{Name: name, Domain: "cloud", Bucket: remote})

	var want [][]byte
	sealSome := func(sh *shard.Shard, parts int) {
		for p := range parts {
			for b := range 3 {
				recs := [][]byte{fmt.Appendf(nil, "part %d batch %d a", p, b), fmt.Appendf(nil, "part %d batch %d b", p, b)}
				if _, err := sh.Append(ctx, recs...); err != nil {
					t.Fatal(err)
				}
				want = append(want, recs...)
			}
			if _, err := sh.Seal(ctx, 1<<30); err != nil {
				t.Fatal(err)
			}
		}
	}
	session := func(replicas []replica.Spec, f func(e *engine.Engine, sh *shard.Shard)) {
		e, err := engine.Open(ctx, engine.Options{Dir: dir, Replicas: replicas, Authority: "local", Seal: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		sh, err := e.OpenShard(ctx, "events")
		if err != nil {
			t.Fatal(err)
		}
		f(e, sh)
		if err := e.FlushAndWaitUploads(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sh.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	session(localOnly, func(_ *engine.Engine, sh *shard.Shard) { sealSome(sh, 3) })
	session(both, func(_ *engine.Engine, sh *shard.Shard) { sealSome(sh, 1) })

	m, err := manifest.LoadFrom(ctx, remote, "events")
	if err != nil || len(m.Parts) != 4 {
		t.Fatalf("the %s replica's manifest: %d parts, %v", name, len(m.Parts), err)
	}
	if n := substratetest.CountObjects(t, remote, manifest.PartsPrefix("events")); n != 1 {
		t.Fatalf("the %s replica holds %d part objects, want 1 (sealed after the attach)", name, n)
	}
	got, err := coldRead(t, remote, name)
	if !errors.Is(err, shard.ErrNoReachableReplica) || !strings.Contains(err.Error(), m.Parts[0].Key) || len(got) != 0 {
		t.Fatalf("replay from %s alone before the backfill: %d records, %v; want it refused naming %s", name, len(got), err, m.Parts[0].Key)
	}

	session(both, func(e *engine.Engine, _ *shard.Shard) {
		if n, err := e.BackfillUnderReplicated(ctx); err != nil || n != 3 {
			t.Fatalf("backfill queued %d, %v; want the 3 parts sealed before the attach", n, err)
		}
	})
	if n := substratetest.CountObjects(t, remote, manifest.PartsPrefix("events")); n != 4 {
		t.Fatalf("after the backfill the %s replica holds %d part objects, want 4", name, n)
	}
	got, err = coldRead(t, remote, name)
	if err != nil || len(got) != len(want) {
		t.Fatalf("replay from %s alone after the backfill: %d records of %d, %v", name, len(got), len(want), err)
	}
	for i := range got {
		if string(got[i]) != string(want[i]) {
			t.Fatalf("record %d differs", i)
		}
	}
}

// coldRead opens a fresh engine on bucket alone and reads shard "events" whole.
func coldRead(t *testing.T, b *substrate.Bucket, name string) ([][]byte, error) {
	t.Helper()
	ctx := context.Background()
	e, err := engine.Open(ctx, engine.Options{Dir: t.TempDir(), Replicas: []replica.Spec{{Name: name, Domain: "cloud", Bucket: b}}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, "events")
	if err != nil {
		t.Fatalf("cold open from %s: %v", name, err)
	}
	var got [][]byte
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			return got, err
		}
		got = append(got, rec.Value)
	}
	return got, nil
}

func gcsProcessBucket(t *testing.T) *substrate.Bucket {
	t.Helper()
	srv, err := emulator.StartGCSProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	d, err := srv.NewDriver(context.Background(), fmt.Sprintf("l0-attach-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	return substratetest.NewBucket(t, "gcs", d)
}

func s3ProcessBucket(t *testing.T) *substrate.Bucket {
	t.Helper()
	srv, err := emulator.StartS3Process()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	d, err := s3.Open(t.Context(), s3.Config{
		Bucket: fmt.Sprintf("l0-attach-%d", time.Now().UnixNano()), Endpoint: srv.Endpoint,
		AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client().CreateBucket(t.Context(), &awss3.CreateBucketInput{Bucket: aws.String(d.Bucket())}); err != nil {
		t.Fatal(err)
	}
	return substratetest.NewBucket(t, "s3", d)
}
