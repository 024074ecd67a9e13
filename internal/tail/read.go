package tail

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/l0store/l0/substrate"
)

// Shipped is one shard's section of one tail object.
type Shipped struct {
	Sequence uint64
	Section
}

// NoFence is ReadShard's until for a stream read to its end.
const NoFence = ^uint64(0)

// readers bounds the objects ReadShard reads at once.
const readers = 8

// suffixBytes is how much of an object's end ReadShard fetches in one request: the
// trailer and, for any object of up to a few hundred shards, the whole index.
const suffixBytes = 64 << 10

// ReadShard returns, in sequence order, the shard's sections in the objects of the
// instance's stream incarnation from sequence from up to the fence at until. The
// read starts at the first object at or after from (Collect deletes a stream's
// objects from its start; a late fencer may fill what it deleted with fences), and
// from there every sequence up to until must hold an object. With until = NoFence it reads up to the first sequence that holds
// nothing, and stops at a fence.
//
// It lists the stream once for the objects and their sizes, then reads up to 8
// objects at a time: for each, one ranged read of its end (trailer and index), and
// one of the shard's section if it has one.
func ReadShard(ctx context.Context, b *substrate.Bucket, instance string, incarnation, from, until uint64, shard string) ([]Shipped, error) {
	secs, _, err := readShard(ctx, b, instance, incarnation, from, until, shard, false)
	return secs, err
}

// readShard is ReadShard, also returning where it stopped: the sequence after the
// last object it read (from if it read none).
//
// With skipGone, an object listed and gone when read is passed over (see
// HistoryOptions.SkipGone).
func readShard(ctx context.Context, b *substrate.Bucket, instance string, incarnation, from, until uint64, shard string, skipGone bool) ([]Shipped, uint64, error) {
	objs, err := listFrom(ctx, b, instance, incarnation, from, until)
	if err != nil {
		return nil, 0, fmt.Errorf("tail: read %s: %w", streamPrefix(instance, incarnation), err)
	}
	next := from
	if len(objs) > 0 {
		next = objs[len(objs)-1].Sequence + 1
	}
	out := make([][]Shipped, len(objs))
	errs := make([]error, len(objs))
	sem := make(chan struct{}, readers)
	var wg sync.WaitGroup
	for i, o := range objs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = readSection(ctx, b, o, incarnation, shard)
			if skipGone && errors.Is(errs[i], substrate.ErrNotFound) {
				out[i], errs[i] = nil, nil
			}
		})
	}
	wg.Wait()
	var all []Shipped
	for i := range objs {
		if errs[i] != nil {
			return nil, 0, errs[i]
		}
		all = append(all, out[i]...)
	}
	return all, next, nil
}

// ReadNext reads on in a stream incarnation that a reader read up to sequence
// from, one object at a time, each found by its key's attributes rather than a
// listing: the shard's sections in the data objects from from on, up to the first
// sequence that holds nothing or a fence. It returns next, the first sequence it
// did not read, and fenced, whether a fence is there (the incarnation ended: read
// on through the chain). A stream with nothing new costs one request.
func ReadNext(ctx context.Context, b *substrate.Bucket, instance string, incarnation, from uint64, shard string) (secs []Shipped, next uint64, fenced bool, err error) {
	for next = from; ; next++ {
		key := Key(instance, incarnation, next)
		attrs, err := b.Attributes(ctx, key)
		switch {
		case errors.Is(err, substrate.ErrNotFound):
			return secs, next, false, nil
		case err != nil:
			return nil, 0, false, fmt.Errorf("tail: read %s: %w", key, err)
		case attrs.Size == 0:
			return secs, next, true, nil
		}
		s, err := readSection(ctx, b, Stored{Sequence: next, Key: key, Size: attrs.Size}, incarnation, shard)
		if errors.Is(err, substrate.ErrNotFound) {
			continue // gone since its attributes were read: as SkipGone
		}
		if err != nil {
			return nil, 0, false, err
		}
		secs = append(secs, s...)
	}
}

// listFrom lists the data objects of the stream to read: from the first at or after
// from, every sequence up to until (a missing one is an error), or with NoFence up
// to the first gap or fence.
func listFrom(ctx context.Context, b *substrate.Bucket, instance string, incarnation, from, until uint64) ([]Stored, error) {
	var out []Stored
	next := func() uint64 { return out[len(out)-1].Sequence + 1 }
	for o, err := range Objects(ctx, b, instance, incarnation, from) {
		switch {
		case err != nil:
			return nil, err
		case until != NoFence && o.Sequence >= until:
			return out, complete(out, until, instance, incarnation)
		case o.Size == 0 && len(out) == 0 && until != NoFence:
			// A fence below the end before any object: a fencer that still saw
			// the incarnation live filled sequences collection had emptied
			// (Fence fills every empty one down to the writer's last object).
			// It stands for what was collected there.
			continue
		case len(out) > 0 && o.Sequence != next(), o.Size == 0:
			if until == NoFence {
				return out, nil // the stream's end: a gap, or a fence
			}
			if o.Size == 0 {
				return nil, fmt.Errorf("%s: %w", o.Key, corrupt(0, "a fence below the stream's end at %d", until))
			}
			return nil, fmt.Errorf("%s: %w", Key(instance, incarnation, next()), substrate.ErrNotFound)
		}
		out = append(out, o)
	}
	return out, complete(out, until, instance, incarnation)
}

// complete reports a stream read up to until that ends short of it.
func complete(out []Stored, until uint64, instance string, incarnation uint64) error {
	if until == NoFence || len(out) == 0 || out[len(out)-1].Sequence+1 == until {
		return nil
	}
	return fmt.Errorf("%s: %w", Key(instance, incarnation, out[len(out)-1].Sequence+1), substrate.ErrNotFound)
}

// readSection reads the shard's section of o, if it has one.
func readSection(ctx context.Context, b *substrate.Bucket, o Stored, incarnation uint64, shard string) ([]Shipped, error) {
	r := &objectReader{ctx: ctx, b: b, key: o.Key}
	n := min(o.Size, suffixBytes)
	end, _, err := b.GetRange(ctx, o.Key, o.Size-n, n)
	if err != nil {
		return nil, fmt.Errorf("tail: read %s: %w", o.Key, err)
	}
	cached := &suffixReader{r: r, off: o.Size - int64(len(end)), data: end}
	ix, err := ReadIndex(cached, o.Size)
	if err != nil {
		return nil, fmt.Errorf("tail: read %s: %w", o.Key, err)
	}
	if ix.Sequence != o.Sequence || ix.Incarnation != incarnation {
		return nil, fmt.Errorf("tail: read %s: %w", o.Key, corrupt(o.Size, "the index names sequence %d of incarnation %d", ix.Sequence, ix.Incarnation))
	}
	e, ok := ix.Find(shard)
	if !ok {
		return nil, nil
	}
	recs, err := ReadSection(cached, e)
	if err != nil {
		return nil, fmt.Errorf("tail: read %s: %w", o.Key, err)
	}
	return []Shipped{{Sequence: o.Sequence, Section: Section{Shard: shard, Epoch: e.Epoch, First: e.First, Records: recs}}}, nil
}

// suffixReader serves reads within the bytes of an object's end it holds from
// memory, and others from r.
type suffixReader struct {
	r    *objectReader
	off  int64 // of data in the object
	data []byte
}

func (s *suffixReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= s.off && off+int64(len(p)) <= s.off+int64(len(s.data)) {
		return copy(p, s.data[off-s.off:]), nil
	}
	return s.r.ReadAt(p, off)
}
