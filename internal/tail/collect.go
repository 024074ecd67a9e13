package tail

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/substrate"
)

// Stored is one object of a stream as a listing shows it.
type Stored struct {
	Sequence uint64
	Key      string
	Size     int64 // 0: a fence
}

// Listed is one incarnation of an instance's stream and its objects, as listed.
type Listed struct {
	Incarnation uint64
	Objects     []Stored // in sequence order
}

// Streams lists every incarnation of instance's streams on b, in order, with its
// objects: one listing of the instance's tail.
func Streams(ctx context.Context, b *substrate.Bucket, instance string) ([]Listed, error) {
	prefix := "tail/" + instance + "/"
	var out []Listed
	for e, err := range b.ListAll(ctx, prefix) {
		if err != nil {
			return nil, err
		}
		inc, seq, ok := strings.Cut(strings.TrimPrefix(e.Key, prefix), "/")
		if !ok {
			continue
		}
		n, err1 := strconv.ParseUint(inc, 10, 64)
		s, err2 := strconv.ParseUint(seq, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if len(out) == 0 || out[len(out)-1].Incarnation != n {
			out = append(out, Listed{Incarnation: n})
		}
		last := &out[len(out)-1]
		last.Objects = append(last.Objects, Stored{Sequence: s, Key: e.Key, Size: e.Size})
	}
	return out, nil
}

// Objects lists the objects of instance's stream incarnation from sequence from on,
// in sequence order, starting the listing there.
func Objects(ctx context.Context, b *substrate.Bucket, instance string, incarnation, from uint64) iter.Seq2[Stored, error] {
	return func(yield func(Stored, error) bool) {
		prefix := streamPrefix(instance, incarnation)
		opts := substrate.ListOptions{}
		if from > 0 {
			opts.StartAfter = Key(instance, incarnation, from-1)
		}
		for {
			page, err := b.List(ctx, prefix, opts)
			if err != nil {
				yield(Stored{}, err)
				return
			}
			for _, e := range page.Entries {
				n, err := strconv.ParseUint(strings.TrimPrefix(e.Key, prefix), 10, 64)
				if err != nil || n < from {
					continue
				}
				if !yield(Stored{Sequence: n, Key: e.Key, Size: e.Size}, nil) {
					return
				}
			}
			if page.Next == "" {
				return
			}
			opts.StartAfter = page.Next
		}
	}
}

// Collect deletes the objects at the start of the stream s, as Streams listed it,
// that no reader needs, in sequence order, and stops at the first it must keep: one
// that needed says a shard still needs (a section not sealed, or not superseded),
// one that old says is too young, a fence (never collected), or, while the stream
// is live (its writer may still put), its last object. It returns how many
// objects it deleted.
//
// Only a prefix goes, so that a reader of the stream (ReadShard) knows a missing
// sequence below the first object there is one collection took, and one above it a
// loss. Keeping a live stream's last object keeps Fence correct: a fencer that
// finds the stream ends there fences after it, where the writer goes next.
func Collect(ctx context.Context, b *substrate.Bucket, s Listed, live bool,
	old func(key string) bool, needed func(seq uint64, e Entry) (bool, error)) (deleted int, err error) {
	objs := s.Objects
	incarnation := s.Incarnation
	// Every object listed is seen by this pass, also those past where it stops:
	// an object's age counts from the first pass that listed it, not from the
	// first that reached it, which would delete one more object a pass.
	aged := make([]bool, len(objs))
	for i, o := range objs {
		aged[i] = old(o.Key)
	}
	for i, o := range objs {
		if o.Size == 0 || (live && i == len(objs)-1) || !aged[i] {
			return deleted, nil
		}
		keep, err := keepObject(ctx, b, o, incarnation, needed)
		if err != nil || keep {
			return deleted, err
		}
		if err := b.Delete(ctx, o.Key); err != nil {
			return deleted, fmt.Errorf("tail: collect %s: %w", o.Key, err)
		}
		deleted++
	}
	return deleted, nil
}

// keepObject reports whether any section of o is needed.
func keepObject(ctx context.Context, b *substrate.Bucket, o Stored, incarnation uint64, needed func(uint64, Entry) (bool, error)) (bool, error) {
	ix, err := ReadIndex(&objectReader{ctx: ctx, b: b, key: o.Key}, o.Size)
	if err != nil {
		// A corrupt object is kept: it is evidence, and nothing proves it unneeded.
		return true, fmt.Errorf("tail: collect %s: %w", o.Key, err)
	}
	if ix.Sequence != o.Sequence || ix.Incarnation != incarnation {
		return true, fmt.Errorf("tail: collect %s: %w", o.Key, corrupt(o.Size, "the index names sequence %d of incarnation %d", ix.Sequence, ix.Incarnation))
	}
	for _, e := range ix.Entries {
		if broken.Is(broken.CollectNeeded) {
			break
		}
		if keep, err := needed(o.Sequence, e); err != nil || keep {
			return true, err
		}
	}
	return false, nil
}

// View is what collection needs to know of a shard's manifest.
type View struct {
	Epoch, Sealed uint64
	// Pointer is the manifest's tail pointer; nil without one.
	Pointer *Pointer
}

// CollectOptions make a Tail delete, every Every, the objects of its instance's
// streams that no shard needs any more.
type CollectOptions struct {
	// Every is the time between passes; zero collects nothing.
	Every time.Duration
	// After is how long an object must have been seen before it goes: a reader
	// that listed it may still be reading it.
	After time.Duration
	// View returns what the shard's manifest says now.
	View func(ctx context.Context, shard string) (View, error)
	// Collected is told how many objects each pass deleted.
	Collected func(n int)
	// Dead, if set, names the instances whose streams a pass also collects:
	// instances gone for good (their leases lapsed long ago), whose own
	// collectors no longer run. A pass ends a dead instance's live incarnation
	// first (a fence, then the chain's End), so that its last objects can go
	// too; a dead instance that comes back meets the fence and starts its next
	// incarnation.
	Dead func(ctx context.Context) ([]string, error)
}

// collectPassBound is the least time a collection pass may take before it is cut.
const collectPassBound = 30 * time.Second

// collect runs a pass every opts.Collect.Every until the tail closes.
func (t *Tail) collect(stop <-chan struct{}) {
	co := t.opts.Collect
	for {
		select {
		case <-stop:
			return
		case <-t.opts.Flush.Clock.After(co.Every):
		}
		// A pass may take longer than the interval (the next starts later); a
		// bound as tight as a test's interval cut deletes short after they
		// landed, uncounted.
		ctx, cancel := context.WithTimeout(t.collectCtx, max(co.Every, collectPassBound))
		if _, err := t.CollectOnce(ctx); err != nil && ctx.Err() == nil {
			t.opts.Logger.Warn("tail: collection", "err", err)
		}
		cancel()
	}
}

// CollectOnce is one pass of collection over every incarnation of the instance's
// stream: each loses the objects at its start that hold no section a shard needs
// (see Collect). A section is needed while it is unsealed and its shard's
// manifest points at it — at or past the pointer, in its incarnation or a later
// one, and before the end a release recorded — under the manifest's epoch; or
// while it is of a later epoch than the manifest's (a takeover that shipped its
// backlog and has not published yet). It returns how many objects it deleted.
func (t *Tail) CollectOnce(ctx context.Context) (int, error) {
	views := map[string]View{}
	viewOf := func(shard string) (View, error) {
		if v, ok := views[shard]; ok {
			return v, nil
		}
		v, err := t.opts.Collect.View(ctx, shard)
		if err != nil {
			return View{}, err
		}
		views[shard] = v
		return v, nil
	}
	now := t.opts.Flush.Clock.Now()
	seen := map[string]time.Time{} // this pass's: the keys it looked at
	t.mu.Lock()
	before := t.mu.seen
	t.mu.Unlock()
	old := func(key string) bool {
		first, ok := before[key]
		if !ok {
			first = now
		}
		seen[key] = first
		return now.Sub(first) >= t.opts.Collect.After
	}
	// The live incarnation is this tail's, or, if another process of the
	// instance has started since (this one is stale), the chain's: its last
	// object stays either way.
	live := []uint64{t.Incarnation()}
	if c, _, err := ReadChain(ctx, t.opts.Bucket, t.opts.Instance); err != nil {
		return 0, err
	} else if l, ok := c.Live(); ok {
		live = append(live, l.N)
	}
	total, err := t.collectInstance(ctx, t.opts.Instance, live, viewOf, old)
	errs := []error{err}
	if t.opts.Collect.Dead != nil {
		dead, err := t.opts.Collect.Dead(ctx)
		errs = append(errs, err)
		for _, inst := range dead {
			if inst == t.opts.Instance {
				continue
			}
			n, err := t.collectDead(ctx, inst, viewOf, old)
			total += n
			errs = append(errs, err)
		}
	}
	// The keys this pass did not look at were deleted, or lie past an object it
	// kept; the latter are seen anew, later, which only delays them.
	t.mu.Lock()
	t.mu.seen = seen
	t.mu.Unlock()
	if t.opts.Collect.Collected != nil {
		t.opts.Collect.Collected(total)
	}
	return total, errors.Join(errs...)
}

// collectDead ends a dead instance's live incarnation, if any, and collects its
// streams.
func (t *Tail) collectDead(ctx context.Context, inst string, viewOf func(string) (View, error), old func(string) bool) (int, error) {
	c, _, err := ReadChain(ctx, t.opts.Bucket, inst)
	if err != nil {
		return 0, err
	}
	if l, ok := c.Live(); ok {
		seq, _, err := Fence(ctx, t.opts.Bucket, inst, l.N, 0)
		if err != nil {
			return 0, fmt.Errorf("tail: end the live incarnation %d of dead instance %s: %w", l.N, inst, err)
		}
		if _, err := End(ctx, t.opts.Bucket, inst, l.N, seq); err != nil {
			// It came back and started another: its own collector runs again.
			return 0, fmt.Errorf("tail: end the live incarnation %d of dead instance %s: %w", l.N, inst, err)
		}
	}
	return t.collectInstance(ctx, inst, nil, viewOf, old)
}

// collectInstance collects every incarnation of inst's stream; live are the
// incarnations whose writers may still put.
func (t *Tail) collectInstance(ctx context.Context, inst string, live []uint64, viewOf func(string) (View, error), old func(string) bool) (int, error) {
	b := t.opts.Bucket
	streams, err := Streams(ctx, b, inst)
	if err != nil {
		return 0, err
	}
	total := 0
	var errs []error
	for _, st := range streams {
		inc := st.Incarnation
		needed := func(seq uint64, e Entry) (bool, error) {
			v, err := viewOf(e.Shard)
			if err != nil {
				return true, err
			}
			if e.Epoch > v.Epoch {
				return true, nil
			}
			p, at := v.Pointer, Position{Incarnation: inc, Sequence: seq}
			switch {
			case p == nil || p.Instance != inst || at.Before(p.From):
				return false, nil // superseded: no reader of the shard looks here
			case p.Until != (Position{}) && !at.Before(p.Until):
				return false, nil
			}
			return e.Epoch == v.Epoch && e.Next > v.Sealed, nil
		}
		n, err := Collect(ctx, b, st, slices.Contains(live, inc), old, needed)
		total += n
		if err != nil {
			errs = append(errs, fmt.Errorf("tail: collect %s incarnation %d: %w", inst, inc, err))
		}
	}
	return total, errors.Join(errs...)
}
