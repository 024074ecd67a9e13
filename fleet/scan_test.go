package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// memMachine is an engine on its own Dir with its own clients of the drivers
// given (the first the authority), each replica in its own domain.
func memMachine(t *testing.T, drivers ...substrate.Driver) *engine.Engine {
	t.Helper()
	return memMachineWith(t, engine.Options{}, drivers...)
}

// memMachineWith is memMachine with engine options (Dir and Replicas its own).
func memMachineWith(t *testing.T, opts engine.Options, drivers ...substrate.Driver) *engine.Engine {
	t.Helper()
	var specs []replica.Spec
	for i, d := range drivers {
		name := fmt.Sprintf("r%d", i)
		b, err := substrate.New(d, substrate.Options{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		specs = append(specs, replica.Spec{Name: name, Domain: name, Bucket: b})
	}
	opts.Dir, opts.Replicas = t.TempDir(), specs
	e, err := engine.Open(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// storeShards opens n shards on e, appends a record to each and closes it: a part
// each, and a manifest nobody holds.
func storeShards(t *testing.T, e *engine.Engine, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sh, err := e.OpenShard(t.Context(), fmt.Sprintf("s%03d", i))
			if err == nil {
				_, err = sh.Append(t.Context(), []byte("r"))
			}
			if err == nil {
				err = sh.Close(t.Context())
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

func noShards(context.Context) ([]Shard, error) { return nil, nil }

func TestScanShardsSplitTheStoreAndOneIsTheSingleWorker(t *testing.T) {
	drv := mem.New()
	seed := memMachine(t, drv)
	storeShards(t, seed, 100)
	var single []string
	for id, err := range seed.StoredShards(t.Context()) {
		if err != nil {
			t.Fatal(err)
		}
		single = append(single, id)
	}
	if len(single) != 100 {
		t.Fatalf("the store lists %d shards, want 100", len(single))
	}
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprint("N=", n), func(t *testing.T) {
			var mu sync.Mutex
			passes := map[int][]ScanResult{}
			var ms []*Membership
			for range 3 {
				m, err := Join(t.Context(), memMachine(t, drv), Options{
					Name: fmt.Sprint("scan", n), Shards: noShards, ScanShards: n, ScanEvery: time.Hour,
					PollEvery: 20 * time.Millisecond, PublishEvery: 20 * time.Millisecond,
					Scanned: func(r ScanResult) {
						mu.Lock()
						passes[r.Scan] = append(passes[r.Scan], r)
						mu.Unlock()
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				ms = append(ms, m)
			}
			defer func() {
				for _, m := range ms {
					if err := m.Leave(context.Background()); err != nil {
						t.Error(err)
					}
				}
			}()
			deadline := time.Now().Add(30 * time.Second) // liveness only
			for {
				mu.Lock()
				done := len(passes) == n
				mu.Unlock()
				if done {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("passes of %d scan shards of %d after 30 s", len(passes), n)
				}
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			seen := map[string]int{}
			for k, rs := range passes {
				r := rs[0]
				if r.Err != nil {
					t.Fatalf("scan shard %d: %v", k, r.Err)
				}
				for _, id := range r.Shards {
					seen[id]++
					if ScanShard(id, n) != k {
						t.Errorf("scan shard %d of %d visited %s, of scan shard %d", k, n, id, ScanShard(id, n))
					}
				}
			}
			for _, id := range single {
				if seen[id] != 1 {
					t.Errorf("shard %s scanned %d times in one pass of each of %d scan shards, want once", id, seen[id], n)
				}
			}
			if n == 1 && !slices.Equal(passes[0][0].Shards, single) {
				t.Errorf("the one scan shard visited %v, want the single worker's order %v", passes[0][0].Shards, single)
			}
			// Then, once the members all listed, each holds its share.
			balanced := func() (string, bool) {
				holders := map[int]int{}
				for _, m := range ms {
					for k := range m.Scans() {
						holders[k]++
					}
					if got, quota := len(m.Scans()), (n+2)/3; got > quota {
						return fmt.Sprintf("%s holds %d scan shards of %d among 3 members, more than its share %d", m.ID(), got, n, quota), false
					}
				}
				for k := range n {
					if holders[k] != 1 {
						return fmt.Sprintf("scan shard %d has %d holders, want 1", k, holders[k]), false
					}
				}
				return "", true
			}
			mu.Unlock()
			for {
				why, ok := balanced()
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal(why)
				}
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
		})
	}
}

// The gauges of an engine cover the shards open on it, so an engine on a
// single-copy store knows no part while none is open and claims nothing; a scan's
// cover every stored shard.
func TestDurabilityGaugesCoverShardsNobodyHasOpen(t *testing.T) {
	t.Run("single copy", func(t *testing.T) {
		e := memMachine(t, mem.New())
		storeShards(t, e, 5)
		if d := e.Metrics().Data; d.SurvivesDomainLoss || d.Parts != 0 {
			t.Fatalf("the engine's own gauges with no shard open: %+v (what this test is about changed)", d)
		}
		reg := prometheus.NewRegistry()
		r := scanOnce(t, e, Options{Registerer: reg})
		if r.Durability.Parts != 5 || r.Durability.SurvivesDomainLoss {
			t.Fatalf("the scan's durability: %+v, want 5 parts that do not survive a domain loss", r.Durability)
		}
		if got := testutil.ToFloat64(gauge(t, reg, "l0_fleet_scan_data_survives_domain_loss")); got != 0 {
			t.Fatalf("l0_fleet_scan_data_survives_domain_loss = %v, want 0", got)
		}
	})
	t.Run("a replica lacks the parts", func(t *testing.T) {
		// The far replica refused every part while the shards were written.
		far := fault.Wrap(mem.New(), 1, fault.Rule{Key: "/parts/", Ops: []substrate.Op{substrate.OpPut, substrate.OpPutIfAbsent}, Err: errors.New("far is down")})
		// Each close waits for its copies for up to a lease's duration: a
		// long lease lets the uploads give up before the closes end, so no copy
		// is still queued when the scans run.
		e := memMachineWith(t, engine.Options{Lease: engine.LeaseOptions{Duration: 30 * time.Second}}, mem.New(), far)
		storeShards(t, e, 5)
		far.SetRules()
		r := scanOnce(t, e, Options{})
		if r.Durability.UnderReplicated != 5 || r.Durability.SurvivesDomainLoss {
			t.Fatalf("the scan's durability: %+v, want 5 parts under-replicated", r.Durability)
		}
		// A scan that backfills copies them, nobody having the shards open.
		r = scanOnce(t, e, Options{ScanBackfill: true})
		if r.Backfilled != 5 {
			t.Fatalf("the backfilling scan copied %d parts, want 5 (%+v)", r.Backfilled, r)
		}
		r = scanOnce(t, e, Options{})
		if r.Durability.UnderReplicated != 0 || !r.Durability.SurvivesDomainLoss {
			t.Fatalf("after the backfill: %+v, want every part on both replicas", r.Durability)
		}
	})
}

// scanOnce joins e to a fleet of its own with one scan shard, waits for one pass
// and leaves.
func scanOnce(t *testing.T, e *engine.Engine, opts Options) ScanResult {
	t.Helper()
	got := make(chan ScanResult, 1)
	opts.Name, opts.Shards, opts.ScanShards, opts.ScanEvery = fmt.Sprint("one-", time.Now().UnixNano()), noShards, 1, time.Hour
	opts.PollEvery = 20 * time.Millisecond
	opts.Scanned = func(r ScanResult) {
		select {
		case got <- r:
		default:
		}
	}
	m, err := Join(t.Context(), e, opts)
	if err != nil {
		t.Fatal(err)
	}
	var r ScanResult
	select {
	case r = <-got:
	case <-time.After(30 * time.Second): // liveness only
		t.Fatal("no scan pass in 30 s")
	}
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	// With a Registerer the caller reads the gauges first: Leave unregisters them.
	t.Cleanup(func() {
		if err := m.Leave(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

// gauge returns the one metric named name that reg gathers, as a collector.
func gauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: "copy"}, func() float64 { return mf.Metric[0].GetGauge().GetValue() })
		}
	}
	t.Fatalf("%s not gathered: %v", name, mfs)
	return nil
}

// A pass deletes the part objects no manifest names and none ever will — sealed
// under an earlier epoch than the manifest's — and keeps the named ones and those
// of the current epoch, which a commit may still name.
func TestAScanDeletesOnlyPartsNoManifestEverNames(t *testing.T) {
	drv := mem.New()
	e := memMachine(t, drv)
	storeShards(t, e, 3)
	// Reopened, appended to and closed again elsewhere: epoch 2, every part named.
	storeShards(t, memMachine(t, drv), 3)
	b := e.Authority()
	m, err := manifest.LoadFrom(t.Context(), b, "s001")
	if err != nil {
		t.Fatal(err)
	}
	orphan := manifest.PartKey("s001", 100, 110, m.Epoch-1, "fenced")
	young := manifest.PartKey("s001", 100, 110, m.Epoch, "inflight")
	for _, k := range []string{orphan, young} {
		if _, err := b.PutBytes(t.Context(), k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Millisecond)
	r := scanOnce(t, e, Options{ScanOrphansAfter: time.Millisecond})
	if r.OrphansDeleted != 1 {
		t.Fatalf("the pass deleted %d orphans, want 1 (%+v)", r.OrphansDeleted, r)
	}
	for k, want := range map[string]bool{orphan: false, young: true} {
		_, err := b.Attributes(t.Context(), k)
		if got := err == nil; got != want {
			t.Errorf("%s there after the pass: %v, want %v (%v)", k, got, want, err)
		}
	}
	for _, p := range m.Parts {
		if _, err := b.Attributes(t.Context(), p.Key); err != nil {
			t.Errorf("named part %s: %v", p.Key, err)
		}
	}
}
