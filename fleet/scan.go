package fleet

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/lease"
	"github.com/l0store/l0/replica"
)

// ScanShard is the scan shard of shard id among n: fnv32a(id) mod n.
func ScanShard(id string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// ScanPass visits every shard stored on e's authority that falls in scan shard k
// of n, in the store's order (engine.StoredShards). With n = 1 it is the single
// worker over the whole store, in the same order.
func ScanPass(ctx context.Context, e *engine.Engine, k, n int, visit func(id string) error) error {
	for id, err := range e.StoredShards(ctx) {
		if err != nil {
			return err
		}
		if ScanShard(id, n) != k {
			continue
		}
		if err := visit(id); err != nil {
			return err
		}
	}
	return nil
}

// ScanResult is one pass of a scan shard.
type ScanResult struct {
	// Scan is the scan shard, of Of.
	Scan, Of int
	// Shards are the shards the pass visited, in order.
	Shards []string
	// Durability is what their parts' copies say, open anywhere or not.
	Durability replica.Durability
	// Backfilled counts the parts copied to the replicas that lacked them, of
	// shards nobody had open; OrphansDeleted the part objects deleted that no
	// manifest names or ever will.
	Backfilled, OrphansDeleted int
	// Err is why the pass ended early, if it did.
	Err  error
	Took time.Duration
}

func scanKey(fleet string, k, n int) string {
	return fmt.Sprintf("fleet/%s/scans/%d-of-%d", fleet, k, n)
}

// scans is a member's share of the scan shards.
type scans struct {
	held    map[int]*lease.Held // the loop's
	last    map[int]time.Time   // the loop's: when each held scan shard's last pass began
	running map[int]bool        // the loop's, under mu
	mu      sync.Mutex
	results map[int]ScanResult
}

// scanStep keeps the member's share of the scan leases among the members the
// assignment lists — renewed, taken while it holds fewer, given back above it;
// none until it is listed — and starts a pass of each one held that is due.
func (m *Membership) scanStep(ctx context.Context, members []string) error {
	n := m.opts.ScanShards
	if n == 0 {
		return nil
	}
	sc := &m.scans
	var errs []error
	for k, h := range sc.held {
		if lost, err := m.renewDue(ctx, h); lost {
			delete(sc.held, k)
		} else if err != nil {
			errs = append(errs, err)
		}
	}
	quota := 0
	if slices.Contains(members, m.id) && !m.leaving() {
		quota = (n + len(members) - 1) / len(members)
	}
	for k := n - 1; k >= 0 && len(sc.held) > quota; k-- {
		if h, ok := sc.held[k]; ok && !sc.isRunning(k) {
			if err := h.Release(ctx); err != nil {
				errs = append(errs, err)
			}
			delete(sc.held, k)
			sc.mu.Lock()
			delete(sc.results, k)
			sc.mu.Unlock()
		}
	}
	for k := 0; k < n && len(sc.held) < quota; k++ {
		if sc.held[k] != nil {
			continue
		}
		h, err := lease.Acquire(ctx, m.bucket, scanKey(m.opts.Name, k, n), m.id, nil, m.leaseOpts)
		if errors.Is(err, lease.ErrHeld) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sc.held[k] = h
	}
	for k, h := range sc.held {
		if _, err := h.Valid(); err != nil || sc.isRunning(k) || m.clock.Now().Before(sc.last[k].Add(m.opts.ScanEvery)) {
			continue
		}
		sc.last[k] = m.clock.Now()
		sc.setRunning(k, true)
		m.wg.Go(func() {
			defer sc.setRunning(k, false)
			r := m.pass(ctx, k, n)
			sc.mu.Lock()
			sc.results[k] = r
			sc.mu.Unlock()
			if m.opts.Scanned != nil {
				m.opts.Scanned(r)
			}
		})
	}
	return errors.Join(errs...)
}

func (sc *scans) isRunning(k int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.running[k]
}

func (sc *scans) setRunning(k int, v bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.running[k] = v
}

// pass is one pass of scan shard k of n: it assesses every shard of it, and
// backfills those nobody has open.
func (m *Membership) pass(ctx context.Context, k, n int) ScanResult {
	start := m.clock.Now()
	r := ScanResult{Scan: k, Of: n}
	r.Err = ScanPass(ctx, m.e, k, n, func(id string) error {
		r.Shards = append(r.Shards, id)
		if m.opts.ScanBackfill {
			c, err := m.e.BackfillIdle(ctx, id)
			r.Backfilled += c
			if err != nil {
				return err
			}
		}
		if m.opts.ScanOrphansAfter > 0 {
			c, err := m.e.CollectOrphanParts(ctx, id, m.opts.ScanOrphansAfter)
			r.OrphansDeleted += c
			if err != nil {
				return err
			}
		}
		return nil
	})
	if r.Err == nil {
		r.Durability, r.Err = m.e.Assess(ctx, r.Shards)
	}
	r.Took = m.clock.Now().Sub(start)
	return r
}

// Scans returns the last pass of each scan shard this member holds.
func (m *Membership) Scans() map[int]ScanResult {
	m.scans.mu.Lock()
	defer m.scans.mu.Unlock()
	out := make(map[int]ScanResult, len(m.scans.results))
	for k, r := range m.scans.results {
		out[k] = r
	}
	return out
}

// releaseScans gives every scan lease up, at Leave.
func (m *Membership) releaseScans(ctx context.Context) error {
	var errs []error
	for k, h := range m.scans.held {
		if err := h.Release(ctx); err != nil {
			errs = append(errs, err)
		}
		delete(m.scans.held, k)
	}
	m.scans.mu.Lock()
	clear(m.scans.results)
	m.scans.mu.Unlock()
	return errors.Join(errs...)
}
