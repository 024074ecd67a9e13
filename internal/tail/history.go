package tail

import (
	"context"
	"errors"
	"fmt"

	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// ErrMissing reports a shard's records that its pointer says are in the tail and
// are not: a reader must not hand out their offsets again.
var ErrMissing = errors.New("tail: records missing")

// Pointer is where a shard's records past its sealed watermark are: in the tail
// of Instance, from From on, through every later incarnation the instance's chain
// lists, in the shard's sections under the owner's epoch. Until, if not zero, is
// where they end, recorded as the owner released the shard.
type Pointer struct {
	Instance string
	From     Position
	Until    Position
}

// PointerOf reads a manifest's tail pointer.
func PointerOf(t *manifest.Tail) Pointer {
	p := Pointer{Instance: t.Instance, From: Position{Incarnation: t.Incarnation, Sequence: t.From}}
	if t.Until != 0 {
		p.Until = Position{Incarnation: t.Incarnation, Sequence: t.Until}
		if t.UntilIncarnation != 0 {
			p.Until.Incarnation = t.UntilIncarnation
		}
	}
	return p
}

// HistoryOptions say how ReadHistory reads a shard's pointer.
type HistoryOptions struct {
	// Take marks the shard taken over at Epoch in the instance's chain and fences
	// the chain's live incarnation, where the pointer has no Until: the owner may
	// still be shipping, and from then on can acknowledge no page of the shard
	// under Epoch in any incarnation the read did not cover.
	Take bool
	// Below, if not zero, is an incarnation not to read, nor any after it: the
	// reader's own, whose pages of the shard it holds already.
	Below uint64
	// SkipGone passes over an object listed and gone when read, for a reader
	// that holds no lease and reads the manifest again when a read comes short:
	// collection deleted it, either because it held nothing of the shard needed
	// at the pointer (objects of other shards), or because a seal moved the
	// pointer past it. Records it held are then missing between others
	// (ErrMissing) or past the last one read (the read is shorter), and found in
	// the parts of the manifest the reader reads next; never read wrong. An
	// owner's read, which keeps what it reads as the history, never skips.
	SkipGone bool
}

// History is what ReadHistory read.
type History struct {
	Records [][]byte // from the sealed watermark on, consecutive
	// Fenced reports that the read fenced a live incarnation; Wrote, that it put
	// a fence there, rather than finding one complete.
	Fenced, Wrote bool
	// Live reports that the read ended in a live incarnation, at its current end
	// (not at a fence, the chain's end for it, or Until); End is where: that
	// incarnation, and the sequence after the last object read. A reader reads
	// on from there (ReadNext) while the pointer stays as it is.
	Live bool
	End  Position
}

// ReadHistory returns the shard's records under epoch from sealed on, as p
// points at them: the pointer's incarnation from its sequence, then each later
// one the chain lists, each up to where the chain says it ended (or the fence the
// read put, or Until). Sections of other epochs are passed over (another
// ownership's pages, or a takeover that lost its race); a record missing between
// sealed and the last one found is ErrMissing.
//
// A pointer into an incarnation the chain does not list (a tail written before
// chains) is read in that incarnation alone, to its fence.
func ReadHistory(ctx context.Context, b *substrate.Bucket, p Pointer, shard string, epoch, sealed uint64, opts HistoryOptions) (History, error) {
	var h History
	type span struct{ n, from, until uint64 }
	var spans []span
	until := p.Until
	released := until != (Position{})
	switch {
	case released && until.Incarnation == p.From.Incarnation:
		spans = []span{{p.From.Incarnation, p.From.Sequence, until.Sequence}}
	default:
		var (
			c   Chain
			err error
		)
		if opts.Take && !released {
			c, err = MarkTaken(ctx, b, p.Instance, shard, epoch)
		} else {
			c, _, err = ReadChain(ctx, b, p.Instance)
		}
		if err != nil {
			return History{}, fmt.Errorf("tail: shard %q: %w", shard, err)
		}
		incs := c.From(p.From.Incarnation)
		if len(incs) > 1 && broken.Is(broken.OneIncarnation) {
			incs = []Incarnation{{N: p.From.Incarnation}}
		}
		if len(incs) == 0 || incs[0].N != p.From.Incarnation {
			incs = []Incarnation{{N: p.From.Incarnation}} // not listed: read to its fence
		}
		for _, inc := range incs {
			if opts.Below != 0 && inc.N >= opts.Below {
				break
			}
			if released && inc.N > until.Incarnation {
				break
			}
			s := span{n: inc.N, until: inc.End}
			if inc.N == p.From.Incarnation {
				s.from = p.From.Sequence
			}
			switch {
			case released && inc.N == until.Incarnation:
				s.until = until.Sequence
			case !inc.Ended && (!opts.Take || broken.Is(broken.SkipFence)):
				s.until = NoFence
			case !inc.Ended:
				seq, met, err := Fence(ctx, b, p.Instance, inc.N, s.from)
				if err != nil {
					return History{}, fmt.Errorf("tail: shard %q: fence %s: %w", shard, streamPrefix(p.Instance, inc.N), err)
				}
				s.until, h.Fenced, h.Wrote = seq, true, h.Wrote || !met
			}
			spans = append(spans, s)
		}
	}
	next := sealed
	for _, s := range spans {
		if s.until != NoFence && s.until <= s.from {
			continue
		}
		sections, end, err := readShard(ctx, b, p.Instance, s.n, s.from, s.until, shard, opts.SkipGone)
		if err != nil {
			return History{}, fmt.Errorf("tail: shard %q: read: %w", shard, err)
		}
		h.Live, h.End = s.until == NoFence, Position{Incarnation: s.n, Sequence: end}
		for _, sec := range sections {
			end := sec.First + uint64(len(sec.Records))
			switch {
			case sec.Epoch != epoch || end <= next:
				continue
			case sec.First > next:
				return History{}, fmt.Errorf("%w: shard %q: incarnation %d of %s holds offsets from %d, the records from %d are not there",
					ErrMissing, shard, s.n, p.Instance, sec.First, next)
			}
			h.Records = append(h.Records, sec.Records[next-sec.First:]...)
			next = end
		}
	}
	return h, nil
}
