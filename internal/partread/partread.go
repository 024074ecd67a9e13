// Package partread reads a sealed part's records from the replicas that may hold
// it: for a shard's owner, and for a reader without a lease.
package partread

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
)

// Read yields the records of p, a part of shard, from *next on, advancing *next;
// more is false when the caller stopped. It reads from the replicas that hold p,
// in specs' order, then from the others (a copy may exist that is not recorded
// yet); on an error or a failed check it goes on, from the next record due, at
// the next replica. When none serves it, the error wraps unreachable and each
// replica's error.
func Read(ctx context.Context, shard string, specs []replica.Spec, p manifest.Part, next *uint64, unreachable error, yield func(offset uint64, value []byte) bool) (more bool, err error) {
	var errs []error
	holders := holders(specs, p)
	for _, sp := range holders {
		more, err := readFrom(ctx, shard, sp.Bucket, p, next, yield)
		if err == nil {
			return more, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %w", sp.Name, err))
	}
	return false, fmt.Errorf("part %s: %w (%d tried): %w", p.Key, unreachable, len(holders), errors.Join(errs...))
}

// holders returns the replicas to read p from: those the manifest names, in
// specs' order, then the rest.
func holders(specs []replica.Spec, p manifest.Part) []replica.Spec {
	var named, rest []replica.Spec
	for _, sp := range specs {
		if slices.Contains(p.Replicas, sp.Name) {
			named = append(named, sp)
		} else {
			rest = append(rest, sp)
		}
	}
	return append(named, rest...)
}

func readFrom(ctx context.Context, shard string, b *substrate.Bucket, p manifest.Part, next *uint64, yield func(uint64, []byte) bool) (more bool, err error) {
	r, err := part.Open(objectReader{ctx, b, p.Key}, p.Size, p.Key, nil)
	if err != nil {
		return false, fmt.Errorf("part %s: %w", p.Key, err)
	}
	if info := r.Info(); info.Shard != shard || info.First != p.First || info.Count != p.Count || info.CRC != p.CRC {
		return false, fmt.Errorf("part %s: holds %s %d+%d crc %08x, the manifest says %d+%d crc %08x: %w",
			p.Key, info.Shard, info.First, info.Count, info.CRC, p.First, p.Count, p.CRC, part.ErrCorrupt)
	}
	for rec, err := range r.Records(*next) {
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return false, fmt.Errorf("part %s: %w", p.Key, err)
		}
		if rec.Offset != *next {
			return false, fmt.Errorf("part %s: offset %d where %d was due: %w", p.Key, rec.Offset, *next, part.ErrCorrupt)
		}
		*next++
		if !yield(rec.Offset, rec.Value) {
			return false, nil
		}
	}
	if *next != p.Next() {
		return false, fmt.Errorf("part %s: ends at %d, the manifest says %d: %w", p.Key, *next, p.Next(), part.ErrCorrupt)
	}
	return true, nil
}

// objectReader reads an object by ranges, for the part reader.
type objectReader struct {
	ctx context.Context
	b   *substrate.Bucket
	key string
}

func (o objectReader) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	data, _, err := o.b.GetRange(o.ctx, o.key, off, int64(len(p)))
	n := copy(p, data)
	if err == nil && n < len(p) {
		err = fmt.Errorf("object %s: %d bytes at %d, asked for %d", o.key, n, off, len(p))
	}
	return n, err
}
