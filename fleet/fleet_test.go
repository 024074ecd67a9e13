package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/emulator"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/gcs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// world is machines over one bucket of fake-gcs-server, run as a process and
// spoken to over HTTP: each machine has its own Dir and its own storage client.
type world struct {
	t      *testing.T
	srv    *emulator.GCS
	bucket string
	shards []Shard
}

func newWorld(t *testing.T, shards int) *world {
	t.Helper()
	srv, err := emulator.StartGCSProcess()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	w := &world{t: t, srv: srv, bucket: fmt.Sprintf("l0-fleet-%d", time.Now().UnixNano())}
	first, err := srv.NewDriver(t.Context(), w.bucket) // creates the bucket
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	for i := range shards {
		w.shards = append(w.shards, Shard{ID: fmt.Sprintf("s%02d", i)})
	}
	return w
}

// machine is an engine on its own Dir and client, its client's calls disturbed by
// rules (none if empty), joined to the fleet.
type machine struct {
	e  *engine.Engine
	m  *Membership
	fd *fault.Driver
}

func (w *world) join(opts Options, rules ...fault.Rule) *machine {
	t := w.t
	t.Helper()
	d, err := gcs.Open(t.Context(), gcs.Config{Bucket: w.bucket, Endpoint: w.srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	fd := fault.Wrap(d, 1, rules...)
	b, err := substrate.New(fd, substrate.Options{Name: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(t.Context(), engine.Options{Dir: t.TempDir(), Bucket: b})
	if err != nil {
		t.Fatal(err)
	}
	opts.Shards = func(context.Context) ([]Shard, error) { return w.shards, nil }
	opts.PollEvery, opts.PublishEvery, opts.RetryEvery = 100*time.Millisecond, 200*time.Millisecond, 20*time.Millisecond
	m, err := Join(t.Context(), e, opts)
	if err != nil {
		t.Fatal(err)
	}
	mc := &machine{e: e, m: m, fd: fd}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := m.Leave(ctx); err != nil && !errors.Is(err, ErrLeft) {
			t.Errorf("leave: %v", err)
		}
		e.Close()
		b.Close()
	})
	return mc
}

// settled waits until every shard is open on the member the published
// assignment names, and no handoff is in flight; want, if not nil, must hold too.
func (w *world) settled(ms []*machine, want func() bool) {
	t := w.t
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // liveness only
	for {
		a, _, err := readAssignment(t.Context(), ms[0].e.Authority(), "default")
		if err != nil {
			t.Fatal(err)
		}
		ok := len(a.Shards) == len(w.shards)
		for _, s := range w.shards {
			mc := byID(ms, a.Shards[s.ID])
			if mc == nil {
				ok = false
				break
			}
			if _, open := mc.m.Shard(s.ID); !open {
				ok = false
			}
		}
		total := 0
		for _, mc := range ms {
			total += len(mc.m.Owned())
		}
		if ok && total == len(w.shards) && (want == nil || want()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet did not settle: assignment %v", a.Shards)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func byID(ms []*machine, id string) *machine {
	for _, mc := range ms {
		if mc.m.ID() == id {
			return mc
		}
	}
	return nil
}

// appenders append to every shard through whichever member has it open, until
// stopped, and keep what was acknowledged and what may have been written.
type appenders struct {
	mu    sync.Mutex
	acked map[string][]string // shard → acknowledged values
	maybe map[string]bool     // values of appends of unknown outcome
	stop  chan struct{}
	wg    sync.WaitGroup
}

func (w *world) startAppenders(ms func() []*machine) *appenders {
	ap := &appenders{acked: map[string][]string{}, maybe: map[string]bool{}, stop: make(chan struct{})}
	for _, s := range w.shards {
		ap.wg.Go(func() {
			for n := 0; ; {
				select {
				case <-ap.stop:
					return
				default:
				}
				var sh *shard.Shard
				for _, mc := range ms() {
					if o, ok := mc.m.Shard(s.ID); ok {
						sh = o
					}
				}
				if sh == nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				v := fmt.Sprintf("%s-%06d", s.ID, n)
				_, err := sh.Append(context.Background(), []byte(v))
				ap.mu.Lock()
				switch {
				case err == nil:
					ap.acked[s.ID] = append(ap.acked[s.ID], v)
					n++
				case errors.Is(err, shard.ErrOutcomeUnknown):
					ap.maybe[v] = true
					n++
				}
				ap.mu.Unlock()
				if err != nil {
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
	return ap
}

func (ap *appenders) halt() {
	close(ap.stop)
	ap.wg.Wait()
}

// checkExactlyOnce reads every shard on its owner: each acknowledged record is
// there exactly once, and nothing else is but appends of unknown outcome.
func (w *world) checkExactlyOnce(ms []*machine, ap *appenders) (records int) {
	t := w.t
	t.Helper()
	for _, s := range w.shards {
		var sh *shard.Shard
		for _, mc := range ms {
			if o, ok := mc.m.Shard(s.ID); ok {
				sh = o
			}
		}
		if sh == nil {
			t.Fatalf("shard %s is open nowhere", s.ID)
		}
		seen := map[string]int{}
		for rec, err := range sh.Read(t.Context(), 0) {
			if err != nil {
				t.Fatalf("read %s: %v", s.ID, err)
			}
			seen[string(rec.Value)]++
		}
		for _, v := range ap.acked[s.ID] {
			if seen[v] != 1 {
				t.Fatalf("shard %s: acknowledged record %s read %d times", s.ID, v, seen[v])
			}
			delete(seen, v)
		}
		for v := range seen {
			if !ap.maybe[v] {
				t.Fatalf("shard %s: read %s, which no append wrote", s.ID, v)
			}
		}
		records += len(ap.acked[s.ID])
	}
	return records
}

func TestAJoiningMemberGetsItsShareWithoutReplay(t *testing.T) {
	w := newWorld(t, 64)
	a, b := w.join(Options{}), w.join(Options{})
	var mu sync.Mutex
	ms := []*machine{a, b}
	members := func() []*machine {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ms)
	}
	w.settled(ms, func() bool { return len(a.m.Owned()) >= 30 && len(b.m.Owned()) >= 30 })
	base := map[string]Stats{} // the first two members' balancing is not the join's
	for _, mc := range ms {
		base[mc.m.ID()] = mc.m.Stats()
	}
	ap := w.startAppenders(members)
	time.Sleep(500 * time.Millisecond)

	c := w.join(Options{})
	mu.Lock()
	ms = append(ms, c)
	mu.Unlock()
	share := len(w.shards) / 3
	w.settled(members(), func() bool { return len(c.m.Owned()) >= share-1 })
	time.Sleep(500 * time.Millisecond) // appends on the moved shards
	ap.halt()

	records := w.checkExactlyOnce(members(), ap)
	var moved, forced, replayed, cooperative uint64
	for _, mc := range members() {
		s, b := mc.m.Stats(), base[mc.m.ID()]
		moved += s.Revocations - b.Revocations
		forced += s.Forced - b.Forced
		cooperative += s.Cooperative - b.Cooperative
		replayed += s.ReplayedRecords - b.ReplayedRecords
		if st := mc.e.Metrics().StrandedRecords; st != 0 {
			t.Errorf("%s stranded %d records", mc.m.ID(), st)
		}
	}
	got := len(c.m.Owned())
	t.Logf("the third member owns %d of %d shards; %d moved, %d cooperative, %d forced, %d records replayed; %d acknowledged records each read back once",
		got, len(w.shards), moved, cooperative, forced, replayed, records)
	if got < share-1 || got > share+2 {
		t.Errorf("the joining member owns %d shards, want its share of about %d", got, share)
	}
	if forced != 0 || cooperative != moved || moved == 0 {
		t.Errorf("%d handoffs: %d cooperative, %d forced; want every one cooperative", moved, cooperative, forced)
	}
	if replayed != 0 {
		t.Errorf("the handoffs made the new owners replay %d records from a tail, want 0", replayed)
	}
	if moved > uint64(got)+2 {
		t.Errorf("%d shards moved for a member that took %d", moved, got)
	}
}

func TestADrainPastItsDeadlineIsForcedAndLosesNothing(t *testing.T) {
	w := newWorld(t, 8)
	// The first member's part uploads hang far past the drain deadline: every
	// cooperative handoff it starts runs out of time sealing.
	slow := fault.Rule{Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent}, Key: "/parts/", Latency: 3 * time.Second}
	a := w.join(Options{DrainDeadline: 200 * time.Millisecond}, slow)
	w.settled([]*machine{a}, nil)
	ap := w.startAppenders(func() []*machine { return []*machine{a} })
	time.Sleep(300 * time.Millisecond)
	ap.halt()

	b := w.join(Options{})
	ms := []*machine{a, b}
	w.settled(ms, func() bool { return len(b.m.Owned()) >= 3 })
	a.fd.SetRules()

	records := w.checkExactlyOnce(ms, ap)
	sa, sb := a.m.Stats(), b.m.Stats()
	t.Logf("%d handoffs, %d forced, %d cooperative; the new owner read %d records from the tail; %d acknowledged records each read back once",
		sa.Revocations, sa.Forced, sa.Cooperative, sb.ReplayedRecords, records)
	if sa.Forced == 0 || sa.Forced != sa.Revocations {
		t.Fatalf("%d handoffs, %d forced: want every one forced past its deadline", sa.Revocations, sa.Forced)
	}
	if sb.ReplayedRecords == 0 {
		t.Fatal("the forced handoffs left the new owner no record to read from the tail")
	}
	for _, mc := range ms {
		if st := mc.e.Metrics().StrandedRecords; st != 0 {
			t.Errorf("%s stranded %d records", mc.m.ID(), st)
		}
	}
}

// countRecords reads sh from 0 and counts its records.
func countRecords(t *testing.T, sh *shard.Shard) int {
	t.Helper()
	n := 0
	for _, err := range sh.Read(t.Context(), 0) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}
