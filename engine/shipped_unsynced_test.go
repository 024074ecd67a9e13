package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// syncsHeldThenFailed wraps fs so that, once held is set, every sync waits until
// release is closed and then fails: a page written then is in the file but never
// on the disk, and its append is never acknowledged.
func syncsHeldThenFailed(fs vfs.FS, held *atomic.Bool, release <-chan struct{}) vfs.FS {
	return errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			if held.Load() {
				<-release
				return errMachineDown
			}
		}
		return nil
	}))
}

// leaselessRead is what a reader without a lease sees of shard id: the manifest on
// the authority, then the tail its pointer names, read with tail.ReadHistory without
// Take (no mark, no fence).
func leaselessRead(t *testing.T, auth, tailBucket *substrate.Bucket, id string) (manifest.Manifest, [][]byte) {
	t.Helper()
	ctx := context.Background()
	m, err := manifest.LoadFrom(ctx, auth, id)
	if err != nil {
		t.Fatal(err)
	}
	if m.Tail == nil {
		return m, nil
	}
	p := tail.PointerOf(m.Tail)
	if !m.Released {
		p.Until = tail.Position{}
	}
	h, err := tail.ReadHistory(ctx, tailBucket, p, id, m.Epoch, m.Sealed, tail.HistoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m, h.Records
}

// sameDirCrash runs A on a crashable file system, appends 3 acknowledged records
// to x, then holds the syncs and appends one more, waits until a leaseless reader
// sees it in the tail, and loses power there. It returns A's options with the
// crashed FS, the reader's view, and the shared driver.
func sameDirCrash(t *testing.T, d Durability, optsA Options, fa *fault.Driver, auth, tailBucket *substrate.Bucket) (Options, [][]byte) {
	t.Helper()
	fsA := vfs.NewCrashableMem()
	var held atomic.Bool
	release := make(chan struct{})
	optsA.FS = syncsHeldThenFailed(fsA, &held, release)
	eA, err := Open(context.Background(), optsA)
	if err != nil {
		t.Fatal(err)
	}
	x := openShard(t, eA, "x")
	for i := range 3 {
		if _, err := x.Append(context.Background(), fmt.Appendf(nil, "acked-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "A shipped", func() bool { return eA.Metrics().TailUnshippedBytes == 0 })
	held.Store(true)
	appended := make(chan error, 1)
	go func() {
		actx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := x.Append(actx, []byte("shipped-unsynced"))
		appended <- err
	}()
	var seen [][]byte
	waitFor(t, 5*time.Second, "a leaseless reader sees the unsynced record in the tail", func() bool {
		_, seen = leaselessRead(t, auth, tailBucket, "x")
		return len(seen) == 4
	})
	// The power goes: A's disk keeps what it synced; A's client calls no more.
	crashed := fsA.CrashClone(vfs.CrashCloneCfg{})
	fa.SetRules(fault.Rule{Err: errMachineDown, Last: true})
	close(release)
	if err := <-appended; err == nil {
		t.Fatal("the unsynced append was acknowledged")
	}
	closed := make(chan error, 1)
	go func() { closed <- eA.Close() }()
	t.Cleanup(func() {
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
		}
	})
	optsA.FS = crashed
	return optsA, seen
}

// TestASameDirRestartKeepsAShippedUnsyncedRecord: a record shipped while its
// fsync runs, then a crash. The restart on the same Dir reads its own earlier
// incarnation (takeover.go: walBehind) and takes the tail's history: the record a
// leaseless reader saw at offset 3 stays at offset 3.
func TestASameDirRestartKeepsAShippedUnsyncedRecord(t *testing.T) {
	for _, d := range []Durability{Remote, Local} {
		t.Run(d.String(), func(t *testing.T) {
			drv := mem.New()
			fa := fault.Wrap(drv, 1)
			optsA := Options{Dir: "a", Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Durability: d, Lease: lateLease, RenewEvery: time.Second}
			readerBucket := substratetest.NewBucket(t, "shared", drv)
			opts, seen := sameDirCrash(t, d, optsA, fa, readerBucket, readerBucket)
			opts.Bucket = substratetest.NewBucket(t, "shared", fault.Wrap(drv, 2))
			eA2 := open(t, opts)
			x := openShard(t, eA2, "x")
			_, seenAfter := leaselessRead(t, readerBucket, readerBucket, "x")
			t.Logf("the leaseless reader after the restart: %q", seenAfter)
			off, err := x.Append(context.Background(), []byte("after the restart"))
			if err != nil {
				t.Fatal(err)
			}
			got := readAll(t, x, 0)
			t.Logf("reader saw %q; after the restart the shard holds %q, the next append went to %d", seen, got, off)
			if len(got) < 4 || string(got[3]) != string(seen[3]) {
				t.Fatalf("offset 3: the reader returned %q, the restarted shard holds %q", seen[3], got)
			}
		})
	}
}

// TestARestartWithoutItsTailReplicaRefusesTheShard: the same crash, with the
// tail on a second replica "t" that the restart's options no longer list. The
// restart cannot check its WAL against what it shipped, and the WAL lacks the
// record a leaseless reader already returned at offset 3: keeping the WAL would
// give that offset to another record. The open refuses with ErrTailMissing. Once
// the shard is sealed and closed cleanly (its manifest has no tail pointer), the
// same options open it.
func TestARestartWithoutItsTailReplicaRefusesTheShard(t *testing.T) {
	for _, d := range []Durability{Remote, Local} {
		t.Run(d.String(), func(t *testing.T) {
			authDrv, tailDrv := mem.New(), mem.New()
			fa := fault.Wrap(authDrv, 1)
			ft := fault.Wrap(tailDrv, 1)
			optsA := Options{Dir: "a", Replicas: []replica.Spec{
				{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", fa)},
				{Name: "t", Domain: "d2", Bucket: substratetest.NewBucket(t, "t", ft)}},
				Authority: "a", Tail: TailOptions{Replica: "t"},
				Seal: quietSealOptions(), Durability: d, Lease: lateLease, RenewEvery: time.Second}
			auth, tb := substratetest.NewBucket(t, "a", authDrv), substratetest.NewBucket(t, "t", tailDrv)
			opts, seen := sameDirCrash(t, d, optsA, fa, auth, tb)
			without := opts
			without.Replicas = []replica.Spec{{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", fault.Wrap(authDrv, 2))}}
			without.Tail = TailOptions{}
			eA2 := open(t, without)
			if _, err := eA2.OpenShard(context.Background(), "x"); !errors.Is(err, ErrTailMissing) {
				t.Fatalf("the restart without the tail replica opened x: %v, want ErrTailMissing", err)
			}
			if err := eA2.Close(); err != nil {
				t.Fatal(err)
			}

			// With the replica back, the restart keeps the record the reader saw,
			// and a seal and a clean
			// close clear the pointer.
			with := opts
			with.Replicas = []replica.Spec{
				{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", fault.Wrap(authDrv, 3))},
				{Name: "t", Domain: "d2", Bucket: substratetest.NewBucket(t, "t", fault.Wrap(tailDrv, 3))}}
			eA3 := open(t, with)
			x := openShard(t, eA3, "x")
			if got := readAll(t, x, 0); len(got) < 4 || string(got[3]) != string(seen[3]) {
				t.Fatalf("offset 3: the reader returned %q, the restarted shard holds %q", seen[3], got)
			}
			// The backlog an open adopts is sealed at once.
			waitFor(t, 10*time.Second, "the backlog sealed", func() bool { return x.Manifest().Sealed == 4 })
			if err := eA3.Close(); err != nil {
				t.Fatal(err)
			}
			if m, err := manifest.LoadFrom(context.Background(), auth, "x"); err != nil || m.Tail != nil {
				t.Fatalf("after a clean close the manifest's tail pointer is %+v (%v), want none", m.Tail, err)
			}
			without.Replicas = []replica.Spec{{Name: "a", Domain: "d1", Bucket: substratetest.NewBucket(t, "a", fault.Wrap(authDrv, 4))}}
			eA4 := open(t, without)
			x = openShard(t, eA4, "x")
			if got := readAll(t, x, 0); len(got) != 4 || string(got[3]) != string(seen[3]) {
				t.Fatalf("the shard without a tail pointer, opened without the tail replica, holds %q", got)
			}
		})
	}
}

// TestATakeoverElsewhereKeepsAShippedUnsyncedRecord: the same crash, and
// B on another machine takes x over once A's lease ran out: it fences A's
// incarnation past the object and reads it (tail.ReadHistory with Take).
func TestATakeoverElsewhereKeepsAShippedUnsyncedRecord(t *testing.T) {
	for _, d := range []Durability{Remote, Local} {
		t.Run(d.String(), func(t *testing.T) {
			drv := mem.New()
			fa := fault.Wrap(drv, 1)
			short := LeaseOptions{Duration: 2 * time.Second, SkewMargin: 200 * time.Millisecond}
			optsA := Options{Dir: "a", Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Durability: d, Lease: short, RenewEvery: 500 * time.Millisecond}
			readerBucket := substratetest.NewBucket(t, "shared", drv)
			_, seen := sameDirCrash(t, d, optsA, fa, readerBucket, readerBucket)
			eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions(), Durability: d, Lease: short, RenewEvery: 500 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			x, err := eB.OpenShard(ctx, "x", WaitForLease())
			if err != nil {
				t.Fatal(err)
			}
			got := readAll(t, x, 0)
			t.Logf("reader saw %q; B holds %q", seen, got)
			if len(got) < 4 || string(got[3]) != string(seen[3]) {
				t.Fatalf("offset 3: the reader returned %q, B holds %q", seen[3], got)
			}
		})
	}
}
