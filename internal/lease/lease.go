// Package lease is a lease held on one object of a substrate: one holder at a time,
// renewed by compare-and-swap, and valid for its holder until a duration after the
// start of its last renewal, less a skew margin, by the holder's own clock.
//
// An engine holds one such lease for its instance (InstanceKey); its shards'
// manifests name the lease (holder and token), and a shard is owned while that
// lease lives. A fleet holds its leader and its scan shards the same way.
//
// The safety argument, for clocks that disagree by less than the skew margin:
//
//   - A holder is valid until E - skew by its own clock, where E is the expiry of a
//     renewal whose write began at E - Duration and completed before the holder's
//     previous validity ended. A renewal that completes later does not extend the
//     validity it restarts: it starts a new generation (Held.Valid), and whatever
//     the holder derived from the old generation (a shard's ownership) must be
//     confirmed again by a compare-and-swap of its own.
//   - Another process may treat the lease as ended only from a read that began at
//     its time t with t > E + skew, E the expiry it read. When that read happens
//     the holder's clock is past E, so the holder's validity from E has ended, and
//     any renewal that had not landed by then completes after it: a new
//     generation.
package lease

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/substrate"
)

var (
	// ErrHeld reports a lease another holder holds (a *HeldError).
	ErrHeld = errors.New("lease: held by another")
	// ErrExpired reports a lease whose holder's validity ran out unrenewed; a
	// renewal may bring it back under a new generation.
	ErrExpired = errors.New("lease: expired")
	// ErrLost reports a lease another process wrote over: it is gone for good.
	ErrLost = errors.New("lease: lost")
	// ErrReleased reports use of a lease after Release.
	ErrReleased = errors.New("lease: released")
	// ErrCorrupt reports a lease object that does not decode.
	ErrCorrupt = errors.New("lease: corrupt")
	// ErrInvalidOptions reports Options that Validate refuses.
	ErrInvalidOptions = errors.New("lease: invalid options")
)

// InstanceKey is the key of the lease an engine named instance holds.
func InstanceKey(instance string) string { return "instances/" + instance + "/lease" }

// InstancesPrefix is the prefix of every instance lease's key.
const InstancesPrefix = "instances/"

// Options configure a lease. The zero value of each field means its default.
type Options struct {
	// Duration is how long a lease lasts after its last renewal began. Default 6 s.
	Duration time.Duration
	// SkewMargin is how much two holders' clocks may disagree. A holder stops
	// being valid SkewMargin before its expiry by its own clock; anyone else
	// takes the lease as ended only SkewMargin after it by theirs. Default 1 s;
	// must be under half of Duration.
	SkewMargin time.Duration
	// Clock is the holder's clock. Default clock.Real.
	Clock clock.Clock
}

// EnsureDefaults fills in the zero fields.
func (o *Options) EnsureDefaults() {
	if o.Duration == 0 {
		o.Duration = 6 * time.Second
	}
	if o.SkewMargin == 0 {
		o.SkewMargin = time.Second
	}
	o.Clock = clock.OrReal(o.Clock)
}

// Validate reports invalid defaulted options.
func (o *Options) Validate() error {
	if o.Duration <= 0 || o.SkewMargin <= 0 || 2*o.SkewMargin >= o.Duration {
		return fmt.Errorf("%w: a lease of %s with a skew margin of %s", ErrInvalidOptions, o.Duration, o.SkewMargin)
	}
	return nil
}

// Record is what a lease object holds.
type Record struct {
	// Holder names who holds the lease.
	Holder string `json:"holder"`
	// Token is drawn at each acquisition: what was derived from one acquisition
	// (a shard's ownership) names it, and ends with it.
	Token string `json:"token"`
	// Expiry is when the lease ends by the holder's clock, unless renewed.
	Expiry time.Time `json:"expiry,omitzero"`
	// Released says the holder gave the lease up.
	Released bool `json:"released,omitempty"`
	// Attrs are the holder's, published with the lease (a fleet member's weight).
	Attrs map[string]string `json:"attrs,omitempty"`
	// Carried are the tokens of the holder's earlier acquisitions that this one
	// vouches for (Continue): what was derived from them is held while this
	// lease lives, until the holder lets them go (Held.Uncarry).
	Carried []string `json:"carried,omitempty"`
	// StandIn marks a record a reader wrote back (Reinstate) when it found the
	// lease object gone: it knows one token of the holder's, not which others
	// the holder's record held, so it holds every token of the holder's until
	// it runs out or the holder's next renewal writes over it.
	StandIn bool `json:"stand_in,omitempty"`
}

// maxCarried bounds the tokens a record carries: restarts that each die before
// letting the carried tokens go (a crash loop) drop the oldest past it.
const maxCarried = 16

// Holds reports whether what was derived from the acquisition of token is held
// under this record (alive or not: see Live): by its own token, a carried one,
// or any token if the record is a stand-in.
func (r Record) Holds(token string) bool {
	return token != "" && (r.StandIn || token == r.Token || slices.Contains(r.Carried, token))
}

// Live reports whether the lease may still be held, for a reader whose read of it
// began at at by the reader's clock: not released, and at is not yet skew past its
// expiry.
func (r Record) Live(at time.Time, skew time.Duration) bool {
	return r.Holder != "" && !r.Released && at.Before(r.Expiry.Add(skew))
}

// Read returns the lease under key with its version, as a reader sees it: the zero
// Record and version when there is none.
func Read(ctx context.Context, b *substrate.Bucket, key string) (Record, substrate.Version, error) {
	r, ver, _, err := read(ctx, b, key)
	return r, ver, err
}

func read(ctx context.Context, b *substrate.Bucket, key string) (Record, substrate.Version, []byte, error) {
	data, attrs, err := b.Get(ctx, key)
	if errors.Is(err, substrate.ErrNotFound) {
		return Record{}, "", nil, nil
	}
	if err != nil {
		return Record{}, "", nil, fmt.Errorf("lease %s: %w", key, err)
	}
	r, err := decode(data)
	if err != nil {
		return Record{}, "", nil, fmt.Errorf("lease %s on %s: %w", key, b.Name(), err)
	}
	return r, attrs.Version, data, nil
}

// ListAll returns every lease object under prefix whose key ends in suffix, with
// its record; the keys of objects that do not decode are returned apart, so that
// one damaged object hides no other.
func ListAll(ctx context.Context, b *substrate.Bucket, prefix, suffix string) (recs map[string]Record, corrupt []string, err error) {
	recs = make(map[string]Record)
	for e, err := range b.ListAll(ctx, prefix) {
		if err != nil {
			return nil, nil, fmt.Errorf("lease: list %s: %w", prefix, err)
		}
		if !strings.HasSuffix(e.Key, suffix) {
			continue
		}
		r, _, err := Read(ctx, b, e.Key)
		if errors.Is(err, ErrCorrupt) {
			corrupt = append(corrupt, e.Key)
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if r.Holder != "" { // deleted since the listing
			recs[e.Key] = r
		}
	}
	return recs, corrupt, nil
}

func encode(r Record) ([]byte, error) { return json.Marshal(r) }

func decode(data []byte) (Record, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if r.Holder == "" || r.Token == "" {
		return Record{}, fmt.Errorf("%w: no holder or token", ErrCorrupt)
	}
	return r, nil
}

// Reinstate writes the lease record r back with the expiry a renewal beginning
// now by opts.Clock would give it, if there is no lease object under key: for a
// reader that finds a lease it knew of gone, whose holder may still be valid by
// its own last renewal. Whoever finds it next waits for that expiry, or for the
// holder's next renewal, which writes over it. It reports whether it wrote.
func Reinstate(ctx context.Context, b *substrate.Bucket, key string, r Record, opts Options) (bool, error) {
	opts.EnsureDefaults()
	r.Expiry, r.Released, r.StandIn = opts.Clock.Now().Add(opts.Duration), false, true
	data, err := encode(r)
	if err != nil {
		return false, err
	}
	_, created, err := b.PutIfAbsentBytes(ctx, key, data)
	if err != nil {
		return false, fmt.Errorf("lease %s: reinstate: %w", key, err)
	}
	return created, nil
}

// ErrChanged reports a Revoke whose lease was written since the caller read it.
var ErrChanged = errors.New("lease: changed since it was read")

// Revoke releases the lease under key on its holder's behalf, for an operator who
// knows the holder is gone for good: by compare-and-swap on ver, the version of
// the record the caller read (and judged), so that a renewal that landed since
// makes it fail with ErrChanged instead. What was derived from the holder's
// acquisitions (the shards owned under it) ends at once, as after the holder's
// own Release. The released record has a token of its own, which no manifest
// names: a holder that still runs meets a record that is not its own at its next
// renewal and loses the lease (ErrLost), where under its own token it would take
// the release for a late write of its own and write over it.
func Revoke(ctx context.Context, b *substrate.Bucket, key string, ver substrate.Version) (Record, error) {
	cur, curVer, err := Read(ctx, b, key)
	if err != nil {
		return Record{}, err
	}
	if cur.Holder == "" || curVer != ver {
		return Record{}, fmt.Errorf("lease %s: %w", key, ErrChanged)
	}
	rec := Record{Holder: cur.Holder, Token: newToken(), Released: true, Attrs: cur.Attrs}
	data, err := encode(rec)
	if err != nil {
		return Record{}, err
	}
	_, werr := b.CompareAndSwapBytes(ctx, key, ver, data)
	if werr == nil {
		return rec, nil
	}
	// A lost reply may hide a write that landed: the object tells.
	_, _, raw, rerr := read(ctx, b, key)
	switch {
	case rerr != nil:
		return Record{}, fmt.Errorf("lease %s: revoke: %w", key, errors.Join(werr, rerr))
	case bytes.Equal(raw, data):
		return rec, nil
	case errors.Is(werr, substrate.ErrPreconditionFailed):
		return Record{}, fmt.Errorf("lease %s: %w", key, ErrChanged)
	}
	return Record{}, fmt.Errorf("lease %s: revoke: %w", key, werr)
}

// HeldError is ErrHeld with the holder and when its lease ends.
type HeldError struct {
	Key    string
	Holder string
	Expiry time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease %s: held by %q until %s", e.Key, e.Holder, e.Expiry.Format(time.RFC3339Nano))
}

func (e *HeldError) Unwrap() error { return ErrHeld }

// Held is a lease this process holds. It is safe for concurrent use: its writes
// are serialized, and Valid never waits for one.
type Held struct {
	bucket *substrate.Bucket
	key    string
	opts   Options
	token  string
	state  atomic.Pointer[state]

	mu struct {
		sync.Mutex // held across a write
		rec        Record
		ver        substrate.Version
		renewed    time.Time // when the write that last extended the lease began
	}
}

// state is the holder's validity: until when, under which generation, or why not.
type state struct {
	until time.Time // by the holder's clock
	gen   uint64
	err   error // sticky: lost or released
}

// Acquire takes the lease under key for holder: at once if there is none, it was
// released, it is holder's own (an earlier acquisition the caller knows has ended,
// such as the previous process on the same directory), or it ended by more than
// the skew margin; otherwise ErrHeld. The takeover is a compare-and-swap on the
// version read, so a renewal by the previous holder either lands first (and
// Acquire finds the lease held) or fails.
func Acquire(ctx context.Context, b *substrate.Bucket, key, holder string, attrs map[string]string, opts Options) (*Held, error) {
	return acquire(ctx, b, key, holder, attrs, opts, false)
}

// Continue is Acquire by a holder that continues its own earlier acquisition,
// which the caller knows has ended (the previous process on the same directory):
// it takes a new token, and carries the earlier one (and those that one carried)
// if the record is the holder's own and was not released, so that whatever was
// derived from them stays held, now by the caller, until it lets them go with
// Uncarry. The earlier process, if it still runs (a copied directory), loses the
// lease at its next renewal, as after Acquire.
func Continue(ctx context.Context, b *substrate.Bucket, key, holder string, attrs map[string]string, opts Options) (*Held, error) {
	return acquire(ctx, b, key, holder, attrs, opts, true)
}

func acquire(ctx context.Context, b *substrate.Bucket, key, holder string, attrs map[string]string, opts Options, carry bool) (*Held, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := substrate.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if holder == "" {
		return nil, fmt.Errorf("%w: no holder", ErrInvalidOptions)
	}
	for attempt := 0; ; attempt++ {
		if attempt == maxRaces {
			return nil, fmt.Errorf("lease %s: %d writes came between a read and a takeover", key, attempt)
		}
		at := opts.Clock.Now()
		cur, ver, err := Read(ctx, b, key)
		if err != nil {
			return nil, err
		}
		if cur.Holder != holder && cur.Live(at, opts.SkewMargin) {
			return nil, &HeldError{Key: key, Holder: cur.Holder, Expiry: cur.Expiry}
		}
		h := &Held{bucket: b, key: key, opts: opts, token: newToken()}
		h.mu.rec = Record{Holder: holder, Token: h.token, Attrs: maps.Clone(attrs)}
		if carry && cur.Holder == holder && cur.Token != "" && !cur.Released {
			h.mu.rec.Carried = append([]string{cur.Token}, cur.Carried...)
			if cur.StandIn {
				// A stand-in's token is one of the earlier record's; which
				// others it carried is not known, and not carried on.
				h.mu.rec.Carried = []string{cur.Token}
			}
			h.mu.rec.Carried = h.mu.rec.Carried[:min(len(h.mu.rec.Carried), maxCarried)]
		}
		h.mu.ver = ver
		h.state.Store(&state{}) // valid once the first write lands
		err = h.writeLocked(ctx, h.mu.rec)
		if errors.Is(err, ErrLost) {
			continue // another acquisition came between: look again
		}
		if err != nil {
			return nil, err
		}
		return h, nil
	}
}

// maxRaces bounds the writes that Acquire lets come between its read and its
// write, and the late writes of its own that a renewal writes over.
const maxRaces = 8

func newToken() string {
	var r [8]byte
	rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// Key is the lease's object key.
func (h *Held) Key() string { return h.key }

// Holder is who holds the lease.
func (h *Held) Holder() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.rec.Holder
}

// Token is the acquisition's token.
func (h *Held) Token() string { return h.token }

// Holds reports whether what was derived from the acquisition of token is held
// by this one: token is its own or one it carries (see Continue).
func (h *Held) Holds(token string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.rec.Holds(token)
}

// Carries reports whether the lease carries earlier acquisitions' tokens.
func (h *Held) Carries() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.mu.rec.Carried) > 0
}

// Uncarry lets the carried tokens go, with a renewal: what was derived from them
// is no longer held.
func (h *Held) Uncarry(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.mu.rec.Carried) == 0 {
		return nil
	}
	rec := h.mu.rec
	rec.Carried = nil
	return h.writeLocked(ctx, rec)
}

// Options are the lease's options, defaulted.
func (h *Held) Options() Options { return h.opts }

// Valid reports whether the holder may act on the lease now, and under which
// generation: nil until its validity runs out (ErrExpired), it is lost (ErrLost)
// or released (ErrReleased). A generation lasts while renewals complete in time;
// one that completes after the validity ran out starts the next.
func (h *Held) Valid() (gen uint64, err error) {
	s := h.state.Load()
	if s.err != nil {
		return 0, s.err
	}
	if !h.opts.Clock.Now().Before(s.until) {
		return s.gen, fmt.Errorf("lease %s: %w", h.key, ErrExpired)
	}
	return s.gen, nil
}

// Renew extends the lease from now. After a failure the lease still ends when it
// would have; once another process wrote over it every call fails with ErrLost.
func (h *Held) Renew(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.writeLocked(ctx, h.mu.rec)
}

// SetAttrs renews the lease with new attributes.
func (h *Held) SetAttrs(ctx context.Context, attrs map[string]string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	rec := h.mu.rec
	rec.Attrs = maps.Clone(attrs)
	return h.writeLocked(ctx, rec)
}

// Attrs returns the attributes last written.
func (h *Held) Attrs() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.mu.rec.Attrs)
}

// Release gives the lease up: the holder stops being valid first, then the record
// says released, so that the next Acquire takes it at once. If the write fails the
// lease runs out at its time.
func (h *Held) Release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.state.Load().err; err != nil {
		return err
	}
	h.state.Store(&state{err: fmt.Errorf("lease %s: %w", h.key, ErrReleased)})
	rec := h.mu.rec
	rec.Released, rec.Expiry = true, time.Time{}
	return h.putLocked(ctx, rec, time.Time{})
}

// writeLocked writes rec with the expiry a renewal that begins now gives it.
func (h *Held) writeLocked(ctx context.Context, rec Record) error {
	if err := h.state.Load().err; err != nil {
		return err
	}
	start := h.opts.Clock.Now()
	rec.Expiry = start.Add(h.opts.Duration)
	return h.putLocked(ctx, rec, start)
}

// putLocked writes rec by compare-and-swap on the version last seen and, for a
// renewal that began at start (not zero), makes the holder valid from it.
func (h *Held) putLocked(ctx context.Context, rec Record, start time.Time) error {
	data, err := encode(rec)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		ver, werr := h.put(ctx, data)
		if werr == nil {
			h.landedLocked(rec, ver, start)
			return nil
		}
		// A precondition failure is another write first (another process's, or
		// ours whose reply was lost); any other error may have landed too. The
		// object tells.
		cur, curVer, raw, rerr := read(ctx, h.bucket, h.key)
		if rerr != nil {
			return fmt.Errorf("lease %s: %w", h.key, errors.Join(werr, rerr))
		}
		if bytes.Equal(raw, data) {
			h.landedLocked(rec, curVer, start)
			return nil
		}
		if cur.Holder == "" && attempt < maxRaces && h.state.Load().gen > 0 {
			// The object is gone (an operator, a lifecycle rule): nobody took
			// the lease, which is still ours; write it anew.
			h.mu.ver = ""
			continue
		}
		if !h.mu.rec.Holds(cur.Token) && !(cur.StandIn && cur.Holder == h.mu.rec.Holder) {
			// Another process wrote over the lease. (A stand-in of ours, under
			// any token of ours, a carried one or one let go, is a reader's
			// write-back of the object deleted: nobody took the lease.)
			return h.lose(fmt.Errorf("lease %s: now %q's: %w", h.key, cur.Holder, ErrLost))
		}
		if !errors.Is(werr, substrate.ErrPreconditionFailed) || attempt == maxRaces {
			// Not there; a request still in flight can land only on the version
			// it was sent for, which the next write replaces.
			return fmt.Errorf("lease %s: %w", h.key, werr)
		}
		// An earlier write of ours that landed late: write over it.
		h.mu.ver = curVer
	}
}

// lose makes every later call fail with err, and returns it.
func (h *Held) lose(err error) error {
	h.state.Store(&state{err: err})
	return err
}

// put is one conditional write of data on the version last seen.
func (h *Held) put(ctx context.Context, data []byte) (substrate.Version, error) {
	if h.mu.ver == "" {
		attrs, created, err := h.bucket.PutIfAbsentBytes(ctx, h.key, data)
		if err == nil && !created {
			err = substrate.ErrPreconditionFailed
		}
		return attrs.Version, err
	}
	attrs, err := h.bucket.CompareAndSwapBytes(ctx, h.key, h.mu.ver, data)
	return attrs.Version, err
}

// landedLocked records that the object holds rec at ver, written by a renewal
// that began at start (zero for a release).
func (h *Held) landedLocked(rec Record, ver substrate.Version, start time.Time) {
	h.mu.rec, h.mu.ver = rec, ver
	if start.IsZero() {
		return
	}
	h.mu.renewed = start
	prev := h.state.Load()
	if prev.err != nil {
		return
	}
	next := &state{until: start.Add(h.opts.Duration - h.opts.SkewMargin), gen: prev.gen}
	if !h.opts.Clock.Now().Before(prev.until) {
		next.gen++ // completed after the validity ran out (or the first write)
	}
	h.state.Store(next)
}

// Renewed is when the write that last extended the lease began: the next renewal
// is due a renewal interval after it.
func (h *Held) Renewed() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.renewed
}
