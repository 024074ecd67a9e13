package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/fleet"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
)

// eventually waits until cond holds, or fails the test after 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 20 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveWriter opens engine "writer" on the store's directory, through a driver of
// its own whose calls a test can fail, with a short lease, and shard s1 on it.
func liveWriter(t *testing.T, s *testStore) (*engine.Engine, *fault.Driver, func() error) {
	t.Helper()
	d, err := local.New(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(d, 1)
	b, err := substrate.New(fd, substrate.Options{Name: "local"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	opts := s.options(t, "writer")
	opts.Replicas = []replica.Spec{{Name: "local", Domain: "node", Bucket: b}}
	opts.Lease = engine.LeaseOptions{Duration: 3 * time.Second, SkewMargin: 500 * time.Millisecond}
	opts.RenewEvery = 500 * time.Millisecond
	e, err := engine.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := e.OpenShard(context.Background(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, sh, 5, "live")
	return e, fd, func() error {
		_, err := sh.Append(context.Background(), []byte("more"))
		return err
	}
}

func TestReleaseLeaseRefusesALiveLeaseAndReleasesALapsedOne(t *testing.T) {
	s := newStore(t, false)
	e, fd, _ := liveWriter(t, s)
	defer e.Close()
	release := cmd(s, "release-lease", "-skew", "500ms", "writer")

	code, _, errOut := l0ctl(t, release...)
	if code != 1 {
		t.Fatalf("release-lease of a live lease: exit %d, want 1", code)
	}
	contains(t, "release-lease", errOut, "the lease of writer is live until", "pass -force")
	_, out, _ := l0ctl(t, cmd(s, "shards", "-skew", "500ms")...)
	contains(t, "shards", out, "s1 0 0 1 writer owned")

	// The engine's machine is cut off from the store: its lease runs out.
	fd.SetRules(fault.Rule{Key: `^instances/writer/lease$`, Err: fault.ErrInjected})
	eventually(t, "the writer's lease lapses", func() bool {
		r, _, err := lease.Read(context.Background(), s.local, lease.InstanceKey("writer"))
		return err == nil && !r.Live(time.Now(), 500*time.Millisecond)
	})
	_, out, _ = l0ctl(t, cmd(s, "shards", "-skew", "500ms")...)
	contains(t, "shards", out, "s1 0 0 1 writer lapsed")

	code, out, _ = l0ctl(t, release...)
	if code != 0 {
		t.Fatalf("release-lease of a lapsed lease: exit %d, want 0", code)
	}
	contains(t, "release-lease", out, "released the lease of writer (lapsed since",
		"shards owned under it, which any engine may now take over at once: 1: s1",
		"engines collect writer's tail as a dead instance's")
	r, _, err := lease.Read(context.Background(), s.local, lease.InstanceKey("writer"))
	if err != nil || !r.Released || r.Holder != "writer" {
		t.Fatalf("the lease after release-lease: %+v, %v", r, err)
	}
	_, out, _ = l0ctl(t, cmd(s, "shards")...)
	contains(t, "shards", out, "s1 0 0 1 writer free (its lease was released)")
	if code, out, _ := l0ctl(t, release...); code != 0 || !contains2(out, "released already") {
		t.Errorf("release-lease of a released lease: exit %d, want 0 and nothing done", code)
	}

	// Another engine takes the shard over at once, with the records acknowledged.
	other, err := engine.Open(context.Background(), s.options(t, "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	sh, err := other.OpenShard(context.Background(), "s1")
	if err != nil {
		t.Fatalf("an open of the released writer's shard: %v", err)
	}
	if next := sh.Info().Next; next != 5 {
		t.Errorf("the shard taken over continues at %d, want 5", next)
	}
}

func TestReleaseLeaseWithForceFencesAnEngineStillRunning(t *testing.T) {
	s := newStore(t, false)
	e, _, appendOne := liveWriter(t, s)
	defer e.Close()
	code, out, _ := l0ctl(t, cmd(s, "release-lease", "-force", "writer")...)
	if code != 0 {
		t.Fatalf("release-lease -force: exit %d, want 0", code)
	}
	contains(t, "release-lease -force", out, "released with -force", "its next renewal finds the lease lost")
	var err error
	// An append in flight as the renewal fails may end with its outcome
	// unknown; every one after is fenced.
	eventually(t, "the writer's appends are fenced", func() bool {
		err = appendOne()
		return errors.Is(err, engine.ErrFenced)
	})
	if !errors.Is(err, lease.ErrLost) {
		t.Errorf("an append after the forced release: %v, want ErrFenced for a lost lease", err)
	}
}

func TestBackfillCopiesThePartsOfAnAttachedReplica(t *testing.T) {
	s := sealedStore(t, false)
	s.gcs, s.gcsName = gcsBucket(t) // attached: it holds nothing yet

	code, out, _ := l0ctl(t, cmd(s, "verify")...)
	if code != 0 {
		t.Fatalf("verify before the backfill: exit %d, want 0 (short copies are not damage)", code)
	}
	contains(t, "verify", out, "s1: note: 3 of 3 parts are not on gcs (under-replicated: l0ctl backfill copies them)")

	code, out, _ = l0ctl(t, cmd(s, "backfill")...)
	if code != 0 {
		t.Fatalf("backfill: exit %d", code)
	}
	contains(t, "backfill", out, "s1: made 3 part copies", "s2: made 3 part copies", "s3: made 3 part copies", "backfilled 9 part copies of 3 shards")

	code, out, _ = l0ctl(t, cmd(s, "verify")...)
	if code != 0 || contains2(out, "note:") {
		t.Fatalf("verify after the backfill: exit %d, want 0 and nothing noted", code)
	}
	contains(t, "verify", out, "verified 3 shards (18 part copies read): no damage")
	_, out, _ = l0ctl(t, cmd(s, "parts", "s2")...)
	contains(t, "parts", out, "0 5 5 1 139 local,gcs")
	_, out, _ = l0ctl(t, cmd(s, "manifest", "s2")...)
	contains(t, "manifest", out, "state authority in step")

	code, out, _ = l0ctl(t, cmd(s, "backfill", "s1")...)
	if code != 0 {
		t.Fatalf("a second backfill: exit %d", code)
	}
	contains(t, "backfill", out, "s1: every part is on every replica given")
	_, out, _ = l0ctl(t, cmd(s, "leases")...)
	contains(t, "leases", out, "l0ctl released")
}

func TestFleetShowsItsMembersAndAssignment(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, false)
	e, err := engine.Open(ctx, s.options(t, "m1"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m, err := fleet.Join(ctx, e, fleet.Options{
		Name: "f", Weight: 2, PollEvery: 20 * time.Millisecond, PublishEvery: 20 * time.Millisecond,
		Shards: func(context.Context) ([]fleet.Shard, error) { return []fleet.Shard{{ID: "a"}, {ID: "b"}}, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	eventually(t, "the member claims both shards", func() bool {
		st, err := fleet.ReadStored(ctx, s.local, "f")
		return err == nil && len(st.Members) == 1 && len(st.Members[0].Shards) == 2
	})
	code, out, _ := l0ctl(t, cmd(s, "fleet")...)
	if code != 0 {
		t.Fatalf("fleet: exit %d", code)
	}
	contains(t, "fleet", out, "fleet f", "leader: m1 (lease live)", "assignment: publish 1, by m1, for members m1",
		"MEMBER LEASE WEIGHT OWNS ASSIGNED", "m1 live 2 2: a,b 2: a,b")
	code, out, _ = l0ctl(t, cmd(s, "fleet", "-json", "f")...)
	var st []fleet.Stored
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || len(st) != 1 || st[0].Assignment["b"] != "m1" {
		t.Fatalf("fleet -json: exit %d, %v: %+v", code, err, st)
	}
	_, out, _ = l0ctl(t, cmd(s, "leases")...)
	contains(t, "leases", out, "m1 live", "l0.fleet=f l0.shards=a,b l0.weight=2")
}

// contains2 reports whether s contains sub.
func contains2(s, sub string) bool { return strings.Contains(s, sub) }
