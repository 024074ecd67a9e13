package sealer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/klauspost/compress/zstd"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/internal/ownership"
	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/wal"
)

// Job is one shard's seal: what it reads, where it writes, and who commits.
type Job struct {
	Shard string
	Epoch uint64
	Log   *wal.Log
	Owner *ownership.Owner
	// Bucket is the first replica, named Replica: parts are written there at seal.
	Bucket  *substrate.Bucket
	Replica string
	// Direct writes each part straight into Bucket, with no local file, for a
	// bucket that streams (substrate.Bucket.Streams) when no other replica needs
	// a copy of it: its bytes are written once, and on a local directory their
	// writeback overlaps the compression. Committed.File is then "".
	Direct bool
	// Dir holds the part file while it is written and put.
	Dir string
	// FS is Dir's file system.
	FS vfs.FS
	// BlockSize and Encoder are the part writer's (see part.Options).
	BlockSize int
	Encoder   *zstd.Encoder
	Clock     clock.Clock
	// Counters, if set, count the seal's outcome.
	Counters *Counters
	// Doubts, if set, keep the parts whose commit had an unknown outcome until a
	// later seal of the shard settles them; without it, such a part's file goes
	// and its copies are left to a backfill.
	Doubts *Doubts
	// Tail, if set, is where the shard's pages are shipped: a commit moves the
	// manifest's tail pointer to where the pages past the part start, and the
	// truncation tells it which pages are sealed.
	Tail Tail
}

// Tail is what a seal asks of the tail the shard's pages are shipped to.
type Tail interface {
	// From returns a position at or before every object of the tail that holds a
	// page of the shard with offsets from offset on (a sequence of an
	// incarnation); ok is false if none is known.
	From(shard string, offset uint64) (incarnation, sequence uint64, ok bool)
	// Sealed says that the shard's pages below floor are sealed.
	Sealed(shard string, floor uint64)
}

// Outcome is what a seal did, and the parts it committed: its own, and the parts
// in doubt it settled as committed (counted as seals of their own). Committed is
// set even with an error, such as a truncation after the commit that failed.
type Outcome struct {
	seal.Result
	Committed []Committed
}

// Committed is a part a seal committed, and its local file ("" for a part
// written straight into its bucket, which needs no local file when no other
// replica takes a copy of it). The file is the source of the part's copies to
// the other replicas, and goes once they end.
type Committed struct {
	Part manifest.Part
	File string
}

// Run seals the shard's oldest unsealed pages, up to budget record bytes but at
// least one page, and returns what it committed (Outcome.Committed):
//
//  1. encode them into a part file in Dir, block by block;
//  2. put the part on the bucket under a key no other attempt uses;
//  3. commit it to the manifest (compare-and-swap on the authority);
//  4. truncate the WAL through the sealed page.
//
// A crash or error between any two steps loses and duplicates nothing: before the
// commit the pages stay in the WAL and the object is an orphan no manifest names;
// after it, the pages below the sealed watermark are dropped by the next seal or
// open (DESIGN.md, "Sealing").
//
// The file of each committed part is the caller's from then on: the source of the
// part's copies to the other replicas, which it removes once they end (at once if
// no replica lacks the part). The job returns the parts rather than queue the
// copies itself, so that what it committed flows back to the shard that asked,
// which queues the copies with its owner as their recorder.
func (j Job) Run(ctx context.Context, budget uint64) (Outcome, error) {
	res, err := j.run(ctx, budget)
	// A closed WAL (the engine closing) and a stale epoch (a newer owner) stop the
	// shard's seals for good, wherever in the job they show.
	if (errors.Is(err, wal.ErrClosed) || errors.Is(err, wal.ErrStaleEpoch)) && !errors.Is(err, ErrStopped) {
		err = errors.Join(err, ErrStopped)
	}
	if j.Counters != nil {
		j.Counters.Observe(res.Result, err)
	}
	return res, err
}

// run seals; the Outcome's Committed are the parts committed, even with an error.
func (j Job) run(ctx context.Context, budget uint64) (Outcome, error) {
	// A fenced or released owner must not even write a part; a lapsed lease may
	// still commit (the CAS decides), so it tries.
	if err := j.Owner.Valid(); errors.Is(err, manifest.ErrFenced) && !errors.Is(err, manifest.ErrLeaseExpired) {
		return Outcome{}, fmt.Errorf("seal %s: %w", j.Shard, errors.Join(err, ErrStopped))
	}
	settled, err := j.settle(ctx)
	if err != nil {
		return Outcome{}, err
	}
	res := Outcome{Committed: settled}
	m := j.Owner.Manifest()
	if m.Epoch != j.Epoch {
		return res, fmt.Errorf("seal %s: epoch %d, the manifest's is %d: %w", j.Shard, j.Epoch, m.Epoch, ErrStopped)
	}
	// Pages a committed seal left behind (its truncation failed) go first.
	if info := j.Log.Info(j.Shard); info.Floor < m.Sealed {
		if err := j.truncate(m.Sealed); err != nil {
			return res, err
		}
	}
	key, path, info, cut, err := j.write(ctx, m.Sealed, budget)
	keep := false
	if path != "" {
		defer func() {
			if !keep {
				j.FS.Remove(path)
			}
		}()
	}
	if err != nil || info.Count == 0 {
		return res, err
	}
	p := manifest.Part{
		Key: key, First: info.First, Count: info.Count, Size: info.Size, CRC: info.CRC,
		SealedAt: j.Clock.Now().UTC(), Epoch: j.Epoch, Replicas: []string{j.Replica},
	}
	commit := func() error { return j.Owner.Commit(ctx, p) }
	if j.Tail != nil {
		if inc, from, ok := j.Tail.From(j.Shard, p.Next()); ok {
			// Every record past the part is in the tail from there on.
			commit = func() error { return j.Owner.CommitTail(ctx, p, inc, from) }
		}
	}
	if err := commit(); err != nil {
		switch {
		case errors.Is(err, manifest.ErrFenced): // ErrReleased is an ErrFenced too
			err = errors.Join(err, ErrStopped)
		case errors.Is(err, manifest.ErrUnknownOutcome) && j.Doubts != nil:
			j.Doubts.add(p, path, info.RawBytes)
			keep = true
		}
		return res, fmt.Errorf("seal %s: commit %s: %w", j.Shard, key, err)
	}
	keep = true // the caller's now
	res.Records, res.RawBytes, res.Objects, res.Size, res.Cut = info.Count, info.RawBytes, 1, info.Size, cut
	res.Committed = append(res.Committed, Committed{Part: p, File: path})
	if err := j.truncate(info.Next()); err != nil {
		return res, err
	}
	return res, nil
}

// Settle decides the parts in doubt (see settle), for a shard that stops without
// sealing again, and returns those that were committed.
func (j Job) Settle(ctx context.Context) ([]Committed, error) { return j.settle(ctx) }

// settle decides the parts in doubt. A write of the manifest settles them: once a
// compare-and-swap of ours has landed, no earlier request can land any more, and
// the owner's view shows each part committed or not. Each committed one counts as
// a seal (the one that wrote it was counted a failure, not knowing) and is
// returned, for its copies; the file of each other one goes.
func (j Job) settle(ctx context.Context) ([]Committed, error) {
	if j.Doubts == nil || j.Doubts.Len() == 0 {
		return nil, nil
	}
	if err := j.Owner.Confirm(ctx); err != nil {
		if errors.Is(err, manifest.ErrFenced) {
			err = errors.Join(err, ErrStopped)
		}
		return nil, fmt.Errorf("seal %s: settle the parts in doubt: %w", j.Shard, err)
	}
	m := j.Owner.Manifest()
	var committed []Committed
	for _, d := range j.Doubts.Take() {
		i := slices.IndexFunc(m.Parts, func(p manifest.Part) bool { return p.Key == d.Part.Key })
		if i < 0 {
			RemoveFile(j.FS, d.File) // never committed: an orphan object
			continue
		}
		p := m.Parts[i]
		if j.Counters != nil {
			j.Counters.Observe(seal.Result{Records: p.Count, RawBytes: d.rawBytes, Objects: 1, Size: p.Size}, nil)
		}
		committed = append(committed, Committed{Part: p, File: d.File})
	}
	return committed, nil
}

func (j Job) truncate(next uint64) error {
	if err := j.Log.TruncateThrough(j.Shard, j.Epoch, next); err != nil {
		return fmt.Errorf("seal %s: truncate the WAL through %d: %w", j.Shard, next, err)
	}
	if j.Tail != nil {
		j.Tail.Sealed(j.Shard, next)
	}
	return nil
}

// write writes the part of the shard's pages from offset from, stopping at the
// first page boundary past budget, to the bucket under a key no other attempt
// uses, and returns the key, the part's local file ("" if Direct, or if there is
// nothing to seal), and whether pages were left.
func (j Job) write(ctx context.Context, from, budget uint64) (key, path string, info part.Info, cut bool, err error) {
	next, cut, err := j.Log.Extent(j.Shard, from, budget)
	if err != nil {
		return "", "", part.Info{}, false, fmt.Errorf("seal %s: read the WAL from %d: %w", j.Shard, from, err)
	}
	if next == from {
		return "", "", part.Info{}, false, nil // nothing to seal: no file to create
	}
	key = manifest.PartKey(j.Shard, from, next, j.Epoch, nonce())
	if j.Direct {
		info, err = j.writeDirect(ctx, key, from, next)
		return key, "", info, cut, err
	}
	path, info, err = j.writeFile(ctx, from, next)
	if err == nil {
		err = j.put(ctx, key, path, info.Size)
	}
	return key, path, info, cut, err
}

// writeDirect encodes the pages [from, next) straight into the object under key.
func (j Job) writeDirect(ctx context.Context, key string, from, next uint64) (part.Info, error) {
	w, err := j.Bucket.NewWriter(ctx, key, substrate.Condition{IfAbsent: true})
	if err != nil {
		return part.Info{}, fmt.Errorf("seal %s: put %s on %s: %w", j.Shard, key, j.Bucket.Name(), err)
	}
	info, err := j.encode(ctx, w, from, next)
	if err != nil {
		w.Abort()
		return part.Info{}, err
	}
	_, err = w.Commit(ctx)
	if errors.Is(err, substrate.ErrPreconditionFailed) {
		err = j.landed(ctx, key, info.Size)
	}
	if err != nil {
		return part.Info{}, fmt.Errorf("seal %s: put %s on %s: %w", j.Shard, key, j.Bucket.Name(), err)
	}
	return info, nil
}

// landed checks that the object already under key, which no other attempt uses, is
// this seal's own whose reply was lost (a client retry finds it): its size is the
// part's.
func (j Job) landed(ctx context.Context, key string, size int64) error {
	attrs, err := j.Bucket.Attributes(ctx, key)
	if err == nil && attrs.Size != size {
		err = fmt.Errorf("an object of %d bytes is already there, the part is %d", attrs.Size, size)
	}
	return err
}

// writeFile encodes the pages [from, next) into a new part file in Dir.
func (j Job) writeFile(ctx context.Context, from, next uint64) (path string, info part.Info, err error) {
	f, path, err := fsutil.CreateTemp(j.FS, j.Dir, "seal-"+j.Shard+"-", ".part")
	if err != nil {
		return "", part.Info{}, fmt.Errorf("seal %s: %w", j.Shard, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("seal %s: %w", j.Shard, cerr)
		}
	}()
	info, err = j.encode(ctx, f, from, next)
	return path, info, err
}

// encode writes the part of the pages [from, next) to w, block by block.
func (j Job) encode(ctx context.Context, w io.Writer, from, next uint64) (part.Info, error) {
	pw := part.NewWriter(w, j.Shard, from, part.Options{BlockSize: j.BlockSize, Encoder: j.Encoder})
	pages := 0
	for page, err := range j.Log.PagesAliased(j.Shard, from) { // Add copies each record
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return part.Info{}, fmt.Errorf("seal %s: read the WAL from %d: %w", j.Shard, from, err)
		}
		if pages == 0 && page.FirstOffset != from {
			return part.Info{}, fmt.Errorf("seal %s: the sealed watermark %d is inside the page at %d: %w", j.Shard, from, page.FirstOffset, wal.ErrNotPageBoundary)
		}
		if page.FirstOffset >= next {
			break
		}
		for _, r := range page.Records {
			if err := pw.Add(r); err != nil {
				return part.Info{}, fmt.Errorf("seal %s: %w", j.Shard, err)
			}
		}
		pages++
		// Compressing is the engine's longest run of CPU, and the scheduler lets a
		// goroutine run 10 ms before it preempts it. Yielding between pages (tens
		// of microseconds of compression each) gives goroutines waiting for a core,
		// such as appenders whose fsync returned, a turn without that wait: with
		// it, l0bench's mixed append p99 fell from 2.7-4.6x alone to 1.7-2.0x.
		runtime.Gosched()
	}
	if pages == 0 {
		return part.Info{}, fmt.Errorf("seal %s: no page from %d to %d: %w", j.Shard, from, next, ErrLogChanged)
	}
	info, err := pw.Close()
	if err != nil {
		return part.Info{}, fmt.Errorf("seal %s: write part: %w", j.Shard, err)
	}
	if info.Next() != next {
		return part.Info{}, fmt.Errorf("seal %s: the pages from %d end at %d, not %d: %w", j.Shard, from, info.Next(), next, ErrLogChanged)
	}
	return info, nil
}

// put writes the part file, of size bytes, to the bucket under key, which no
// earlier attempt used. An object already there is this seal's own put whose reply
// was lost (a client retry finds it): success, if its size is the file's.
func (j Job) put(ctx context.Context, key, path string, size int64) error {
	f, err := j.FS.Open(path)
	if err != nil {
		return fmt.Errorf("seal %s: %w", j.Shard, err)
	}
	defer f.Close()
	_, created, err := j.Bucket.PutIfAbsent(ctx, key, io.NewSectionReader(f, 0, size))
	if err == nil && !created {
		err = j.landed(ctx, key, size)
	}
	if err != nil {
		return fmt.Errorf("seal %s: put %s on %s: %w", j.Shard, key, j.Bucket.Name(), err)
	}
	return nil
}

// nonce makes part keys unique across attempts, owners and engines.
func nonce() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RemoveFile removes a part's local file, where it has one: a part written
// straight into its bucket (Job.Direct) has none.
func RemoveFile(fsys vfs.FS, file string) {
	if file != "" {
		fsys.Remove(file)
	}
}

// CleanDir removes part files that a crash left in dir: no manifest names them.
func CleanDir(fsys vfs.FS, dir string) error { return fsutil.RemoveMatching(fsys, dir, "seal-*.part") }
