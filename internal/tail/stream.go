package tail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/l0store/l0/substrate"
)

// ErrFenced reports that a stream met a fence: another owner has ended it, and its
// writer may ship nothing more in it.
var ErrFenced = errors.New("tail: stream fenced")

// Stream writes the objects of one incarnation of an instance's tail, one sequence
// after another, with put-if-absent. It is not safe for concurrent use: one
// flusher owns it.
type Stream struct {
	bucket      *substrate.Bucket
	instance    string
	incarnation uint64
	writer      string
	next        uint64 // the sequence of the next object
	// pending is the object whose put failed with an unknown outcome, to be put
	// again, byte for byte, before anything else.
	pending []byte
	// spare is the memory of the last object put, to lay out the next in: no
	// bucket keeps a body once its put has returned. Never the pending object's.
	spare  []byte
	fenced error
}

// maxSpare is the largest object whose memory a stream keeps for the next.
const maxSpare = 16 << 20

// NewStream returns the stream of instance's incarnation on b that continues at
// sequence next; writer is unique to this process.
func NewStream(b *substrate.Bucket, instance string, incarnation, next uint64, writer string) *Stream {
	return &Stream{bucket: b, instance: instance, incarnation: incarnation, next: next, writer: writer}
}

// Incarnation is the incarnation whose stream this is.
func (s *Stream) Incarnation() uint64 { return s.incarnation }

// Next is the sequence the next Put writes.
func (s *Stream) Next() uint64 { return s.next }

// Put writes sections as the stream's next object and returns its sequence once
// it is durable on the bucket.
//
// An error other than ErrFenced leaves the outcome unknown (the object may have
// landed): the caller calls Put again with the same sections, which settles it —
// the object is the same bytes, and an object already there that is byte for byte
// this one is this writer's own put whose reply was lost. Put refuses other
// sections until then. Once a fence (a zero-byte object) or another writer's
// object holds the sequence, every Put is ErrFenced.
func (s *Stream) Put(ctx context.Context, sections []Section) (uint64, error) {
	if s.fenced != nil {
		return 0, s.fenced
	}
	data, err := AppendEncoded(s.spare, Header{Instance: s.instance, Incarnation: s.incarnation, Sequence: s.next, Writer: s.writer}, sections)
	if err != nil {
		return 0, err
	}
	// Until this put succeeds, data may become the pending object, which the next
	// Put compares its own with: it must not lay that out in the same memory.
	s.spare = nil
	if s.pending != nil && !bytes.Equal(data, s.pending) {
		return 0, fmt.Errorf("%w: the put of sequence %d is not settled; put the same sections again", ErrInvalid, s.next)
	}
	key := Key(s.instance, s.incarnation, s.next)
	_, created, err := s.bucket.PutIfAbsentBytes(ctx, key, data)
	if err != nil {
		s.pending = data
		return 0, fmt.Errorf("tail: put %s: %w", key, err)
	}
	if !created {
		there, _, err := s.bucket.Get(ctx, key)
		if err != nil {
			s.pending = data
			return 0, fmt.Errorf("tail: put %s: an object is there: %w", key, err)
		}
		if !bytes.Equal(there, data) {
			what := "another writer's object"
			if len(there) == 0 {
				what = "a fence"
			}
			s.fenced = fmt.Errorf("%w: %s holds %s", ErrFenced, what, key)
			return 0, s.fenced
		}
	}
	s.pending = nil
	if cap(data) <= maxSpare {
		s.spare = data
	}
	seq := s.next
	s.next++
	return seq, nil
}

// streamPrefix is the key prefix of one incarnation's objects.
func streamPrefix(instance string, incarnation uint64) string {
	k := Key(instance, incarnation, 0)
	return k[:strings.LastIndexByte(k, '/')+1]
}

// Fence ends the instance's stream incarnation at or after sequence from and
// returns where: the lowest fence (zero-byte object) in the stream, with every
// sequence from from up to it holding the writer's objects, so that a reader of
// [from, fence) reads everything the writer can ever have been told is durable.
// met reports that no fence had to be written (another fencer's, or this one's
// whose reply was lost, was complete): Fence is idempotent and safe to retry after
// an error, and to run beside another fencer.
//
// A fence found above from proves nothing about the sequences below it — its
// fencer may not have filled them yet, or a listing may have missed a lower one —
// so every Fence fills, from its top fence down until the writer's last object,
// every sequence that holds nothing. A writer that wins every race for the next
// sequence cannot starve it: each lost race doubles how far ahead the top fence
// goes.
func Fence(ctx context.Context, b *substrate.Bucket, instance string, incarnation, from uint64) (seq uint64, met bool, err error) {
	// The listing only saves puts: where the writer got to, and a fence to fill
	// down from. The put-if-absent calls decide.
	first, top, found := from, uint64(0), false
	for o, err := range Objects(ctx, b, instance, incarnation, from) {
		if err != nil {
			return 0, false, err
		}
		switch {
		case o.Size == 0:
			if !found || o.Sequence < top {
				top, found = o.Sequence, true
			}
		case o.Sequence >= first:
			first = o.Sequence + 1
		}
	}
	met = true
	for ahead := uint64(0); !found; ahead = max(1, 2*ahead) {
		at := first + ahead
		fenced, created, err := putFence(ctx, b, instance, incarnation, at)
		if err != nil {
			return 0, false, err
		}
		if !fenced {
			first = at + 1 // the writer got there first
			continue
		}
		top, found, met = at, true, !created
	}
	low := top
	for s := top; s > from; s-- {
		fenced, created, err := putFence(ctx, b, instance, incarnation, s-1)
		if err != nil {
			return 0, false, err
		}
		if !fenced {
			break // the writer's object: it wrote every sequence below too
		}
		low, met = s-1, met && !created
	}
	return low, met, nil
}

// putFence puts a fence at seq if nothing is there, and reports whether a fence
// holds seq now, and whether this call created it.
func putFence(ctx context.Context, b *substrate.Bucket, instance string, incarnation, seq uint64) (fenced, created bool, err error) {
	key := Key(instance, incarnation, seq)
	if _, created, err = b.PutIfAbsentBytes(ctx, key, nil); err != nil {
		return false, false, fmt.Errorf("tail: fence %s: %w", key, err)
	}
	if created {
		return true, true, nil
	}
	a, err := b.Attributes(ctx, key)
	if err != nil {
		return false, false, fmt.Errorf("tail: fence %s: %w", key, err)
	}
	return a.Size == 0, false, nil
}

// objectReader reads an object of a bucket by ranges.
type objectReader struct {
	ctx context.Context
	b   *substrate.Bucket
	key string
}

func (r *objectReader) ReadAt(p []byte, off int64) (int, error) {
	data, _, err := r.b.GetRange(r.ctx, r.key, off, int64(len(p)))
	n := copy(p, data)
	if err == nil && n < len(p) {
		err = fmt.Errorf("tail: %s: %d bytes at %d, want %d", r.key, n, off, len(p))
	}
	return n, err
}
