// Package fault wraps a substrate driver to inject failures: errors by operation, by
// key pattern, by probability with a seed, or on the i-th call; added latency; reads
// that break off part way; and the ambiguous failure, where the write happens but the
// caller gets an error, which every retry path above the substrate must survive.
//
// Wrap the driver, not the Bucket, so that injected failures are classified and
// counted by the Bucket like real ones:
//
//	fd := fault.Wrap(mem.New(), 1, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 1, Err: fault.ErrInjected})
//	b, _ := substrate.New(fd, substrate.Options{Name: "faulty"})
package fault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/substrate"
)

// ErrInjected is the error rules inject unless they name another.
var ErrInjected = errors.New("fault: injected failure")

// Rule says which calls to disturb and how. A call matches a rule when its operation
// is in Ops (any, if empty) and its key (a list's prefix) matches Key (any, if empty).
type Rule struct {
	Ops []substrate.Op
	// Key is a regular expression matched against the key.
	Key string
	// Nth, when positive, fires the rule on the Nth matching call only (1-based);
	// otherwise it fires on each matching call with probability Probability.
	Nth int
	// Probability is the chance that a matching call fires the rule; 0 means 1.
	// Draws come from the seed given to Wrap, so a run can be replayed.
	Probability float64
	// Latency is added to every matching call, fired or not.
	Latency time.Duration
	// Err is returned by a fired call. Nil makes a latency-only rule.
	Err error
	// Ambiguous performs a fired write (or read) before returning Err: the object
	// store changed, the caller was told it failed.
	Ambiguous bool
	// ReadBreaksAfter, for a fired read, delivers this many bytes and then fails the
	// read with Err instead of failing the call that opens it.
	ReadBreaksAfter int64
	// Last makes a fired call the driver's last: every call decided after it
	// fails with Err, as from a machine that died the moment that call was made
	// (or, with Ambiguous, had landed). SetRules revives the driver.
	Last bool
}

// Driver is a substrate.Driver that disturbs the calls its rules select.
type Driver struct {
	next     substrate.Driver
	calls    atomic.Int64
	injected atomic.Int64
	mu       struct {
		sync.Mutex
		rules []*rule
		rng   *rand.Rand
		dead  *Rule // set once a Last rule fired
	}
}

type rule struct {
	Rule
	key     *regexp.Regexp
	matched int
}

var _ substrate.Driver = (*Driver)(nil)

// Wrap returns a Driver over next with rules, drawing probabilities from seed. It
// panics on a Key that is not a valid regular expression: rules are written by tests.
func Wrap(next substrate.Driver, seed uint64, rules ...Rule) *Driver {
	d := &Driver{next: next}
	d.mu.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	d.SetRules(rules...)
	return d
}

// SetRules replaces the rules and restarts their counts of matching calls.
func (d *Driver) SetRules(rules ...Rule) {
	compiled := make([]*rule, len(rules))
	for i, r := range rules {
		compiled[i] = &rule{Rule: r}
		if r.Key != "" {
			compiled[i].key = regexp.MustCompile(r.Key)
		}
	}
	d.mu.Lock()
	d.mu.rules = compiled
	d.mu.dead = nil
	d.mu.Unlock()
}

// Calls returns how many calls reached the wrapper.
func (d *Driver) Calls() int64 { return d.calls.Load() }

// Injected returns how many calls a rule fired on.
func (d *Driver) Injected() int64 { return d.injected.Load() }

// decision is what the rules decided for one call.
type decision struct {
	latency time.Duration
	fired   *Rule
}

func (d *Driver) decide(op substrate.Op, key string) decision {
	d.calls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	var dec decision
	if d.mu.dead != nil {
		d.injected.Add(1)
		return decision{fired: d.mu.dead}
	}
	for _, r := range d.mu.rules {
		if (len(r.Ops) > 0 && !slices.Contains(r.Ops, op)) || (r.key != nil && !r.key.MatchString(key)) {
			continue
		}
		r.matched++
		dec.latency += r.Latency
		if dec.fired != nil || r.Err == nil {
			continue
		}
		fires := r.matched == r.Nth
		if r.Nth <= 0 {
			fires = r.Probability <= 0 || d.mu.rng.Float64() < r.Probability
		}
		if fires {
			dec.fired = &r.Rule
			if r.Last {
				d.mu.dead = &Rule{Err: r.Err}
			}
		}
	}
	if dec.fired != nil {
		d.injected.Add(1)
	}
	return dec
}

// before applies the latency and reports whether the call should still go ahead.
func (dec decision) before(ctx context.Context) (proceed bool, err error) {
	if dec.latency > 0 {
		t := time.NewTimer(dec.latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if dec.fired == nil || dec.fired.Ambiguous {
		return true, nil
	}
	return false, dec.injectedErr()
}

// after turns the result of a call that went ahead into what the caller sees.
func (dec decision) after(err error) error {
	if err == nil && dec.fired != nil && dec.fired.Ambiguous {
		return dec.injectedErr()
	}
	return err
}

func (dec decision) injectedErr() error {
	if dec.fired.Ambiguous {
		return fmt.Errorf("fault: after the operation took effect: %w", dec.fired.Err)
	}
	return dec.fired.Err
}

func opOf(cond substrate.Condition) substrate.Op {
	switch {
	case cond.IfAbsent:
		return substrate.OpPutIfAbsent
	case cond.IfMatch != "":
		return substrate.OpCompareAndSwap
	}
	return substrate.OpPut
}

// Streams reports whether the wrapped driver takes objects as streams.
func (d *Driver) Streams() bool { return substrate.Streams(d.next) }

// NewWriter starts an object on the wrapped driver; the rules for its write apply
// at Commit, as they do to a Put.
func (d *Driver) NewWriter(ctx context.Context, key string, cond substrate.Condition) (substrate.DriverWriter, error) {
	wd, ok := d.next.(substrate.WriterDriver)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	w, err := wd.NewWriter(ctx, key, cond)
	if err != nil {
		return nil, err
	}
	return &writer{d: d, key: key, cond: cond, DriverWriter: w}, nil
}

// writer is an object being written through the wrapper.
type writer struct {
	substrate.DriverWriter
	d    *Driver
	key  string
	cond substrate.Condition
}

func (w *writer) Commit(ctx context.Context) (substrate.Attrs, error) {
	dec := w.d.decide(opOf(w.cond), w.key)
	if ok, err := dec.before(ctx); !ok {
		w.DriverWriter.Abort()
		return substrate.Attrs{}, err
	}
	attrs, err := w.DriverWriter.Commit(ctx)
	return attrs, dec.after(err)
}

// Put implements substrate.Driver.
func (d *Driver) Put(ctx context.Context, key string, body io.ReadSeeker, cond substrate.Condition) (substrate.Attrs, error) {
	dec := d.decide(opOf(cond), key)
	if ok, err := dec.before(ctx); !ok {
		return substrate.Attrs{}, err
	}
	attrs, err := d.next.Put(ctx, key, body, cond)
	return attrs, dec.after(err)
}

// NewRangeReader implements substrate.Driver.
func (d *Driver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	dec := d.decide(substrate.OpGet, key)
	var breaks *Rule
	if dec.fired != nil && dec.fired.ReadBreaksAfter > 0 {
		// Open normally and break the stream instead.
		breaks, dec.fired = dec.fired, nil
	}
	if ok, err := dec.before(ctx); !ok {
		return nil, err
	}
	r, err := d.next.NewRangeReader(ctx, key, off, length)
	if err = dec.after(err); err != nil {
		if r != nil {
			r.Close()
		}
		return nil, err
	}
	if breaks != nil {
		return &brokenReader{DriverReader: r, left: breaks.ReadBreaksAfter, err: breaks.Err}, nil
	}
	return r, nil
}

// Attributes implements substrate.Driver.
func (d *Driver) Attributes(ctx context.Context, key string) (substrate.Attrs, error) {
	dec := d.decide(substrate.OpAttributes, key)
	if ok, err := dec.before(ctx); !ok {
		return substrate.Attrs{}, err
	}
	attrs, err := d.next.Attributes(ctx, key)
	return attrs, dec.after(err)
}

// List implements substrate.Driver; rules match the prefix as the key.
func (d *Driver) List(ctx context.Context, prefix, startAfter string, limit int) ([]substrate.ListEntry, bool, error) {
	dec := d.decide(substrate.OpList, prefix)
	if ok, err := dec.before(ctx); !ok {
		return nil, false, err
	}
	entries, more, err := d.next.List(ctx, prefix, startAfter, limit)
	if err = dec.after(err); err != nil {
		return nil, false, err
	}
	return entries, more, nil
}

// Delete implements substrate.Driver.
func (d *Driver) Delete(ctx context.Context, key string) error {
	dec := d.decide(substrate.OpDelete, key)
	if ok, err := dec.before(ctx); !ok {
		return err
	}
	return dec.after(d.next.Delete(ctx, key))
}

// Close implements substrate.Driver; it is never disturbed.
func (d *Driver) Close() error { return d.next.Close() }

// brokenReader delivers left bytes, then fails.
type brokenReader struct {
	substrate.DriverReader
	left int64
	err  error
}

func (r *brokenReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, fmt.Errorf("fault: read broke off: %w", r.err)
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n, err := r.DriverReader.Read(p)
	r.left -= int64(n)
	return n, err
}
