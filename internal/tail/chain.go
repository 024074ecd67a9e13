package tail

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"

	"github.com/l0store/l0/substrate"
)

// The chain object: one per instance, beside its lease, advanced by
// compare-and-swap. It lists the instance's incarnations in order, each ended
// at the sequence of the fence that ended it, or live (the last one only), and
// marks (shard, epoch) for the shards taken over from the instance.
//
// Encoding: chainMagic, a version byte, the chain as JSON (canonical: the
// decoder accepts only the bytes the encoder writes) and a CRC-32C (Castagnoli)
// of all that, big-endian.

// ChainVersion is the format version of the chain object this package writes
// and reads.
const ChainVersion = 1

// MaxChainSize is the largest chain object encoded or decoded.
const MaxChainSize = 4 << 20

const (
	chainMagic = "l0chain"
	// chainAttempts bounds the conditional writes of one chain update that lose
	// a race or whose outcome a read settled as not landed.
	chainAttempts = 64
)

var (
	// ErrUnknownOutcome reports a chain write that may or may not have landed:
	// it failed, and reading the chain back did not settle it (the object had
	// not moved, so the request may still be in flight). The next write on the
	// chain settles it.
	ErrUnknownOutcome = errors.New("tail: chain write outcome unknown")
	// ErrIncarnation is matched by every *IncarnationError.
	ErrIncarnation = errors.New("tail: incarnation out of order")
)

// ChainKey is the key of instance's chain object, beside its instance lease.
func ChainKey(instance string) string { return "instances/" + instance + "/tail-chain" }

// Chain is an instance's chain object.
type Chain struct {
	Instance     string        `json:"instance"`
	Incarnations []Incarnation `json:"incarnations,omitempty"`
	Marks        []Mark        `json:"marks,omitempty"`
}

// Incarnation is one incarnation of an instance's tail: ended at End, the
// sequence of the fence that ended it, or live.
type Incarnation struct {
	N     uint64 `json:"n"`
	End   uint64 `json:"end,omitempty"`
	Ended bool   `json:"ended,omitempty"`
}

// Mark says that a shard was taken over from the instance at an owner epoch.
type Mark struct {
	Shard string `json:"shard"`
	Epoch uint64 `json:"epoch"`
}

// ChainCorruptError says why a chain object was refused. It matches ErrCorrupt.
type ChainCorruptError struct {
	Reason string
}

func (e *ChainCorruptError) Error() string { return "tail: corrupt chain object: " + e.Reason }

func (e *ChainCorruptError) Is(target error) bool { return target == ErrCorrupt }

func chainCorrupt(format string, args ...any) error {
	return &ChainCorruptError{Reason: fmt.Sprintf(format, args...)}
}

// IncarnationError reports a Reincarnate the chain cannot take: its next
// incarnation is not past every listed one, or the chain disagrees about the
// incarnation it ends. It matches ErrIncarnation.
type IncarnationError struct {
	Instance string
	Reason   string
}

func (e *IncarnationError) Error() string {
	return fmt.Sprintf("tail: chain of %q: %s", e.Instance, e.Reason)
}

func (e *IncarnationError) Is(target error) bool { return target == ErrIncarnation }

// From returns the incarnations a reader follows from incarnation n: n and every
// later one, in order.
func (c Chain) From(n uint64) []Incarnation {
	for i, inc := range c.Incarnations {
		if inc.N >= n {
			return append([]Incarnation(nil), c.Incarnations[i:]...)
		}
	}
	return nil
}

// Taken reports whether the chain marks shard as taken over at epoch.
func (c Chain) Taken(shard string, epoch uint64) bool {
	for _, m := range c.Marks {
		if m.Shard == shard && m.Epoch == epoch {
			return true
		}
	}
	return false
}

// Live returns the live incarnation, the last one if it has not ended.
func (c Chain) Live() (Incarnation, bool) {
	if n := len(c.Incarnations); n > 0 && !c.Incarnations[n-1].Ended {
		return c.Incarnations[n-1], true
	}
	return Incarnation{}, false
}

func (c Chain) find(n uint64) (int, bool) {
	for i, inc := range c.Incarnations {
		if inc.N == n {
			return i, true
		}
	}
	return 0, false
}

func (c Chain) clone() Chain {
	c.Incarnations = append([]Incarnation(nil), c.Incarnations...)
	c.Marks = append([]Mark(nil), c.Marks...)
	return c
}

// check reports what makes c an invalid chain, or "".
func (c Chain) check() string {
	if err := checkInstance(c.Instance); err != nil {
		return err.Error()
	}
	for i, inc := range c.Incarnations {
		switch {
		case i > 0 && inc.N <= c.Incarnations[i-1].N:
			return fmt.Sprintf("incarnation %d follows %d", inc.N, c.Incarnations[i-1].N)
		case !inc.Ended && i != len(c.Incarnations)-1:
			return fmt.Sprintf("incarnation %d is live and not the last", inc.N)
		case !inc.Ended && inc.End != 0:
			return fmt.Sprintf("live incarnation %d has an end", inc.N)
		}
	}
	seen := make(map[Mark]bool, len(c.Marks))
	for _, m := range c.Marks {
		switch {
		case m.Shard == "":
			return "a mark without a shard"
		case seen[m]:
			return fmt.Sprintf("mark (%q, %d) twice", m.Shard, m.Epoch)
		}
		seen[m] = true
	}
	return ""
}

func checkInstance(instance string) error {
	if instance == "" || strings.Contains(instance, "/") || len(instance) > MaxID {
		return fmt.Errorf("%w: instance %q", ErrInvalid, instance)
	}
	return nil
}

// EncodeChain returns the durable encoding of c.
func EncodeChain(c Chain) ([]byte, error) {
	if why := c.check(); why != "" {
		return nil, fmt.Errorf("%w: chain: %s", ErrInvalid, why)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	b := append([]byte(chainMagic), ChainVersion)
	b = append(b, body...)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if len(b) > MaxChainSize {
		return nil, fmt.Errorf("%w: chain of %d bytes", ErrInvalid, len(b))
	}
	return b, nil
}

// DecodeChain parses and checks a chain object. Every refusal is a
// *ChainCorruptError.
func DecodeChain(b []byte) (Chain, error) {
	if len(b) < len(chainMagic)+1+4 || string(b[:len(chainMagic)]) != chainMagic {
		return Chain{}, chainCorrupt("not a chain object")
	}
	if len(b) > MaxChainSize {
		return Chain{}, chainCorrupt("%d bytes", len(b))
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[len(body):]) {
		return Chain{}, chainCorrupt("checksum mismatch")
	}
	if v := b[len(chainMagic)]; v != ChainVersion {
		return Chain{}, chainCorrupt("unknown format version %d", v)
	}
	var c Chain
	dec := json.NewDecoder(bytes.NewReader(body[len(chainMagic)+1:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Chain{}, chainCorrupt("%v", err)
	}
	if why := c.check(); why != "" {
		return Chain{}, chainCorrupt("%s", why)
	}
	// Only the encoder's bytes: no other spelling of the same chain.
	if again, err := EncodeChain(c); err != nil || !bytes.Equal(again, b) {
		return Chain{}, chainCorrupt("not in canonical form")
	}
	return c, nil
}

// ReadChain returns instance's chain with its version: the chain with no
// incarnations and marks, and the empty version, when there is none.
func ReadChain(ctx context.Context, b *substrate.Bucket, instance string) (Chain, substrate.Version, error) {
	return readChain(ctx, b, instance)
}

func readChain(ctx context.Context, b *substrate.Bucket, instance string) (Chain, substrate.Version, error) {
	if err := checkInstance(instance); err != nil {
		return Chain{}, "", err
	}
	key := ChainKey(instance)
	data, attrs, err := b.Get(ctx, key)
	if errors.Is(err, substrate.ErrNotFound) {
		return Chain{Instance: instance}, "", nil
	}
	if err != nil {
		return Chain{}, "", fmt.Errorf("tail: chain %s: %w", key, err)
	}
	c, err := DecodeChain(data)
	if err == nil && c.Instance != instance {
		err = chainCorrupt("chain of %q under %s", c.Instance, key)
	}
	if err != nil {
		return Chain{}, "", fmt.Errorf("tail: chain %s on %s: %w", key, b.Name(), err)
	}
	return c, attrs.Version, nil
}

// Reincarnate ends incarnation live of instance at end, the sequence of the
// fence that ended it, and makes next the live one, in one conditional write of
// the chain. A chain that does not list live (the first, or one written before
// it) gets it as ended. next must be past every listed incarnation. A chain
// that already holds the write (live ended at end, next right after it) is
// returned as it is.
//
// It returns the chain as written: its marks name the shards taken over from
// the instance, whose handles the caller must fence.
func Reincarnate(ctx context.Context, b *substrate.Bucket, instance string, live, end, next uint64) (Chain, error) {
	return reincarnate(ctx, b, instance, live, end, next, false)
}

// Restart is Reincarnate by a new process of the instance, which holds no
// ownership of the one before: the marks go, since that process's ownerships
// are over (every shard it held is opened again, at a new epoch). The marks
// the write dropped are not returned.
func Restart(ctx context.Context, b *substrate.Bucket, instance string, live, end, next uint64) (Chain, error) {
	return reincarnate(ctx, b, instance, live, end, next, true)
}

// Begin makes next the live incarnation of a chain with none live (none yet, or
// every one ended), past every listed one, and drops the marks, as Restart does.
// A chain whose live incarnation is next already is returned as it is.
func Begin(ctx context.Context, b *substrate.Bucket, instance string, next uint64) (Chain, error) {
	done := func(c Chain) bool {
		l, ok := c.Live()
		return ok && l.N == next
	}
	apply := func(c Chain) (Chain, error) {
		if l, ok := c.Live(); ok {
			return Chain{}, &IncarnationError{Instance: instance, Reason: fmt.Sprintf("incarnation %d is live", l.N)}
		}
		if n := len(c.Incarnations); n > 0 && c.Incarnations[n-1].N >= next {
			return Chain{}, &IncarnationError{Instance: instance, Reason: fmt.Sprintf("next incarnation %d not past %d", next, c.Incarnations[n-1].N)}
		}
		c.Incarnations = append(c.Incarnations, Incarnation{N: next})
		c.Marks = nil
		return c, nil
	}
	return updateChain(ctx, b, instance, done, apply)
}

// End ends incarnation live at end, the sequence after its last object, with no
// incarnation after it: a process that closed cleanly, having shipped
// everything. A reader then stops there without fencing, and the next process
// begins without fencing it. A chain whose live incarnation is another one is
// left as it is (*IncarnationError).
func End(ctx context.Context, b *substrate.Bucket, instance string, live, end uint64) (Chain, error) {
	done := func(c Chain) bool {
		i, ok := c.find(live)
		return ok && c.Incarnations[i].Ended && c.Incarnations[i].End == end
	}
	apply := func(c Chain) (Chain, error) {
		l, ok := c.Live()
		if !ok || l.N != live {
			return Chain{}, &IncarnationError{Instance: instance, Reason: fmt.Sprintf("incarnation %d is not live", live)}
		}
		c.Incarnations[len(c.Incarnations)-1] = Incarnation{N: live, End: end, Ended: true}
		return c, nil
	}
	return updateChain(ctx, b, instance, done, apply)
}

func reincarnate(ctx context.Context, b *substrate.Bucket, instance string, live, end, next uint64, fresh bool) (Chain, error) {
	done := func(c Chain) bool {
		i, ok := c.find(live)
		return ok && c.Incarnations[i].Ended && c.Incarnations[i].End == end &&
			i+1 < len(c.Incarnations) && c.Incarnations[i+1].N == next
	}
	apply := func(c Chain) (Chain, error) {
		refuse := func(format string, args ...any) (Chain, error) {
			return Chain{}, &IncarnationError{Instance: instance, Reason: fmt.Sprintf(format, args...)}
		}
		if fresh {
			c.Marks = nil
		}
		if next <= live {
			return refuse("next incarnation %d not past %d", next, live)
		}
		if l, ok := c.Live(); ok && l.N != live {
			return refuse("incarnation %d is live, not %d", l.N, live)
		}
		if i, ok := c.find(live); ok {
			switch inc := c.Incarnations[i]; {
			case inc.Ended && inc.End != end:
				return refuse("incarnation %d ended at %d, not %d", live, inc.End, end)
			case !inc.Ended:
				c.Incarnations[i] = Incarnation{N: live, End: end, Ended: true}
			}
		} else {
			if n := len(c.Incarnations); n > 0 && c.Incarnations[n-1].N >= live {
				return refuse("incarnation %d not listed, and not past %d", live, c.Incarnations[n-1].N)
			}
			c.Incarnations = append(c.Incarnations, Incarnation{N: live, End: end, Ended: true})
		}
		if last := c.Incarnations[len(c.Incarnations)-1].N; next <= last {
			return refuse("next incarnation %d not past %d", next, last)
		}
		c.Incarnations = append(c.Incarnations, Incarnation{N: next})
		return c, nil
	}
	return updateChain(ctx, b, instance, done, apply)
}

// MarkTaken adds the mark (shard, epoch) to instance's chain, in one
// conditional write; a chain that holds it already is returned as it is.
//
// It returns the chain as written: its live incarnation (the last, if live) is
// the one the caller must fence. A chain with no incarnations yet (the
// instance has never reincarnated) holds the mark for its first Reincarnate.
func MarkTaken(ctx context.Context, b *substrate.Bucket, instance, shard string, epoch uint64) (Chain, error) {
	if shard == "" {
		return Chain{}, fmt.Errorf("%w: a mark without a shard", ErrInvalid)
	}
	done := func(c Chain) bool { return c.Taken(shard, epoch) }
	apply := func(c Chain) (Chain, error) {
		c.Marks = append(c.Marks, Mark{Shard: shard, Epoch: epoch})
		return c, nil
	}
	return updateChain(ctx, b, instance, done, apply)
}

// updateChain writes apply(chain) by a conditional write on the version read,
// unless done(chain). A write that failed is settled by reading the chain back
// and going again from there: a chain that done holds took the write (the bytes
// written, or those of a later write that kept it, since marks and incarnations
// are never dropped); a chain that moved without it never will take it (the
// write was conditional on the version before), so the update is made afresh; a
// chain that did not move may still take it: ErrUnknownOutcome. It is a read
// there, not the same bytes, that tells a write landed: a takeover's mark may
// follow the owner's reincarnation before the owner reads back.
func updateChain(ctx context.Context, b *substrate.Bucket, instance string, done func(Chain) bool, apply func(Chain) (Chain, error)) (Chain, error) {
	key := ChainKey(instance)
	cur, ver, err := readChain(ctx, b, instance)
	if err != nil {
		return Chain{}, err
	}
	var werr error
	for attempt := 0; ; attempt++ {
		if done(cur) {
			return cur, nil
		}
		if attempt == chainAttempts {
			return Chain{}, fmt.Errorf("tail: chain %s: %d attempts: %w", key, attempt, werr)
		}
		next, err := apply(cur.clone())
		if err != nil {
			return Chain{}, err
		}
		data, err := EncodeChain(next)
		if err != nil {
			return Chain{}, err
		}
		werr = putChain(ctx, b, key, ver, data)
		if werr == nil {
			return next, nil
		}
		back, backVer, rerr := readChain(ctx, b, instance)
		if rerr != nil {
			if errors.Is(werr, substrate.ErrPreconditionFailed) {
				return Chain{}, rerr
			}
			return Chain{}, fmt.Errorf("tail: chain %s: %w: %w", key, ErrUnknownOutcome, errors.Join(werr, rerr))
		}
		if !errors.Is(werr, substrate.ErrPreconditionFailed) && backVer == ver {
			return Chain{}, fmt.Errorf("tail: chain %s: %w: %w", key, ErrUnknownOutcome, werr)
		}
		cur, ver = back, backVer
	}
}

// putChain is one conditional write of data on version ver ("": none yet).
func putChain(ctx context.Context, b *substrate.Bucket, key string, ver substrate.Version, data []byte) error {
	if ver == "" {
		_, created, err := b.PutIfAbsentBytes(ctx, key, data)
		if err == nil && !created {
			err = substrate.ErrPreconditionFailed
		}
		return err
	}
	_, err := b.CompareAndSwapBytes(ctx, key, ver, data)
	return err
}
