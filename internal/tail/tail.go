package tail

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/broken"
	"github.com/l0store/l0/internal/fsutil"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/wal"
)

// Options configure a Tail.
type Options struct {
	// Bucket holds the instance's streams and its chain.
	Bucket *substrate.Bucket
	// Instance names the instance whose tail this is.
	Instance string
	// NextIncarnation returns an incarnation past after, and past every one an
	// earlier process of the instance was given, and keeps it so: each
	// incarnation is written by one process alone.
	NextIncarnation func(after uint64) (uint64, error)
	// Flush configures the flusher (its Next is the Tail's).
	Flush FlushOptions
	// Taken is told, from the flusher's goroutine, of each shard a takeover
	// marked in the chain, with its epoch: the shard's owner here must stop, as
	// its pages under that epoch fail from then on. It must not block.
	Taken func(shard string, epoch uint64)
	// Collect, with Every set, deletes the objects no shard needs any more.
	Collect CollectOptions
	// Logger reports the tail's reincarnations and its failed chain writes.
	Logger *slog.Logger
}

// Tail ships the pages of every shard of one instance to its stream on the
// object store, one object per flush, in one incarnation after another: each
// process of the instance starts a new one, and so does a process whose stream
// a takeover fenced. The instance's chain object lists them; a reader follows
// it from a shard's pointer (see ReadHistory).
//
// A new incarnation starts in one conditional write of the chain, whatever the
// number of shards (see next): the pages the fenced stream did not take go in
// the new one, and none of them is acknowledged before that write landed. The
// chain's marks name the shards a takeover took: their pages fail instead.
type Tail struct {
	opts    Options
	flusher *Flusher
	writer  string

	// collectCtx ends when Close begins; stopCollect stops the collector, and
	// collected is closed once it returned.
	collectCtx  context.Context
	stopCollect context.CancelFunc
	collected   chan struct{}

	mu struct {
		sync.Mutex
		shards map[string]*shardPages
		taken  map[Mark]bool // every mark seen, across incarnations
		// seen is when collection first listed each object.
		seen map[string]time.Time
	}
}

// shardPages is what a tail knows of the pages one shard gave it.
type shardPages struct {
	epoch uint64
	end   uint64 // the offset after the last page given
	last  *Ticket
	// given are the pages given under epoch since the floor, in offset order
	// (see From).
	given []givenPage
}

type givenPage struct {
	first uint64
	t     *Ticket
}

// Open starts the instance's tail. Its first incarnation starts in the
// background, before its first put: the previous process's live incarnation is
// fenced, and the new one made live in the chain (see next).
func Open(opts Options) *Tail {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Flush.ensureDefaults()
	var w [8]byte
	rand.Read(w[:])
	t := &Tail{opts: opts, writer: hex.EncodeToString(w[:])}
	t.mu.shards = map[string]*shardPages{}
	t.mu.taken = map[Mark]bool{}
	fo := opts.Flush
	fo.Next = t.next
	t.flusher = NewFlusher(nil, fo)
	t.collectCtx, t.stopCollect = context.WithCancel(context.Background())
	t.collected = make(chan struct{})
	go func() {
		defer close(t.collected)
		if opts.Collect.Every > 0 && opts.Collect.View != nil {
			t.collect(t.collectCtx.Done())
		}
	}()
	return t
}

// Add gives the tail one page of shard, appended under epoch, whose records
// have offsets from first on; it copies them. Pages of a shard come in offset
// order; a page under a new epoch, or at an offset below the end of the last
// one (the shard's pages given again from a lower offset), starts the shard
// afresh.
func (t *Tail) Add(shard string, epoch, first uint64, recs [][]byte) *Ticket {
	t.mu.Lock()
	defer t.mu.Unlock()
	tk := t.flusher.Add(shard, epoch, first, recs)
	if _, done, err := tk.State(); done && errors.Is(err, ErrInvalid) {
		return tk // refused alone: the shard's pages are as they were
	}
	sp := t.mu.shards[shard]
	if sp == nil || sp.epoch != epoch || first < sp.end {
		sp = &shardPages{epoch: epoch}
		t.mu.shards[shard] = sp
	}
	sp.given = append(sp.given, givenPage{first, tk})
	sp.end = first + uint64(len(recs))
	sp.last = tk
	return tk
}

// Gather holds flushes back until done is called (see Flusher.Gather).
func (t *Tail) Gather() (done func()) { return t.flusher.Gather() }

// WaitRoom waits while the tail holds maxBytes unshipped, or a page maxAge old
// (see Flusher.WaitRoom).
func (t *Tail) WaitRoom(ctx context.Context, maxBytes int, maxAge time.Duration) error {
	return t.flusher.WaitRoom(ctx, maxBytes, maxAge)
}

// Sink is the tail as the WAL's sink: the WAL gives it every page it logs, and
// waits for room while maxBytes are unshipped or a page is maxAge old.
func (t *Tail) Sink(maxBytes int, maxAge time.Duration) wal.Sink {
	return sink{t, maxBytes, maxAge}
}

type sink struct {
	t        *Tail
	maxBytes int
	maxAge   time.Duration
}

func (s sink) Take(shard string, epoch, first uint64, recs [][]byte) wal.Shipment {
	return s.t.Add(shard, epoch, first, recs)
}

func (s sink) Room(ctx context.Context) error { return s.t.WaitRoom(ctx, s.maxBytes, s.maxAge) }

func (s sink) Gather() func() { return s.t.Gather() }

// IncarnationFile is a NextIncarnation that keeps the last incarnation given in
// dir/incarnation: it returns one past that and past listed, and keeps it before
// returning, so that no two processes of an instance write the same incarnation
// even when the chain lost track of one (a process that never listed its own).
func IncarnationFile(fsys vfs.FS, dir string) func(listed uint64) (uint64, error) {
	return func(listed uint64) (uint64, error) {
		path := filepath.Join(dir, "incarnation")
		var n uint64
		b, err := fsutil.ReadFile(fsys, path)
		switch {
		case err == nil:
			n, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("tail: %s: %w", path, err)
			}
		case !errors.Is(err, os.ErrNotExist):
			return 0, fmt.Errorf("tail: %w", err)
		}
		n = max(n, listed) + 1
		if err := fsutil.WriteFileAtomic(fsys, path, []byte(strconv.FormatUint(n, 10)+"\n")); err != nil {
			return 0, fmt.Errorf("tail: %w", err)
		}
		return n, nil
	}
}

// Position returns a position at or before every object that holds a page
// given from now on, once the tail has a stream, or ctx's error.
func (t *Tail) Position(ctx context.Context) (Position, error) {
	select {
	case <-t.flusher.Started():
		return t.flusher.Next(), nil
	case <-t.flusher.Done():
		return Position{}, t.flusher.Err()
	case <-ctx.Done():
		return Position{}, ctx.Err()
	}
}

// Next is the flusher's Next: the position of the object in flight or the next
// one; the zero Position before the first incarnation.
func (t *Tail) Next() Position { return t.flusher.Next() }

// Incarnation is the incarnation the tail ships in, or the one it shipped in
// last while it starts the next; 0 before the first.
func (t *Tail) Incarnation() uint64 { return t.flusher.Next().Incarnation }

// From returns a position at or before every object that holds, or will hold, a
// page of the shard with offsets from offset on: where a manifest's tail
// pointer can move once everything before offset is sealed. ok is false if none
// is known (a page there whose shipment failed, or a shard never given).
func (t *Tail) From(shard string, offset uint64) (at Position, ok bool) {
	t.mu.Lock()
	sp := t.mu.shards[shard]
	if sp == nil {
		t.mu.Unlock()
		return Position{}, false
	}
	var tk *Ticket
	for _, g := range sp.given {
		if g.first >= offset {
			tk = g.t
			break
		}
	}
	if tk == nil {
		defer t.mu.Unlock()
		// Pages given from now on (Add holds t.mu) go at or after Next.
		select {
		case <-t.flusher.Started():
			return t.flusher.Next(), true
		default:
			return Position{}, false
		}
	}
	t.mu.Unlock()
	return t.flusher.Bound(tk)
}

// Forget drops what the tail knows of the shard's pages below floor: they are
// sealed, and no From asks for them again.
func (t *Tail) Forget(shard string, floor uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sp := t.mu.shards[shard]
	if sp == nil {
		return
	}
	i := 0
	for i < len(sp.given) && sp.given[i].first < floor {
		i++
	}
	sp.given = sp.given[i:]
}

// Drop forgets the shard: it is closed here.
func (t *Tail) Drop(shard string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.mu.shards, shard)
}

// Until waits until every page of the shard given to the tail is shipped, and
// returns a position past every object that holds one: where a reader of the
// shard can stop. It returns the last page's error if that failed, and ok
// false if the shard gave the tail nothing.
func (t *Tail) Until(ctx context.Context, shard string) (until Position, ok bool, err error) {
	t.mu.Lock()
	sp := t.mu.shards[shard]
	var last *Ticket
	if sp != nil {
		last = sp.last
	}
	t.mu.Unlock()
	if last == nil {
		return Position{}, false, nil
	}
	if err := last.Wait(ctx); err != nil {
		return Position{}, false, err
	}
	at, _, _ := last.State()
	return Position{Incarnation: at.Incarnation, Sequence: at.Sequence + 1}, true, nil
}

// Stats returns the tail's counters, over every incarnation.
func (t *Tail) Stats() FlushStats { return t.flusher.Stats() }

// Done is closed once the tail stopped: closed, or unable to start an
// incarnation (Err says why).
func (t *Tail) Done() <-chan struct{} { return t.flusher.Done() }

// Err is why the tail stopped, once Done is closed.
func (t *Tail) Err() error { return t.flusher.Err() }

// Close stops the tail's collection, and the tail once what it was given is
// shipped, or when ctx ends.
//
// A tail that shipped everything ends its incarnation in the chain, where the
// next process of the instance, and the reader of a shard it leaves, find it
// ended and need not fence it. If that write fails they fence it instead.
func (t *Tail) Close(ctx context.Context) error {
	t.stopCollect()
	<-t.collected
	if err := t.flusher.Close(ctx); err != nil {
		return err
	}
	select {
	case <-t.flusher.Started():
	default:
		return nil // never began: nothing to end
	}
	if errors.Is(t.flusher.Err(), ErrFenced) {
		return nil
	}
	at := t.flusher.Next()
	if _, err := End(ctx, t.opts.Bucket, t.opts.Instance, at.Incarnation, at.Sequence); err != nil && !errors.Is(err, ErrIncarnation) {
		t.opts.Logger.Warn("tail: the incarnation could not be ended in the chain; the next process fences it", "incarnation", at.Incarnation, "err", err)
	}
	return nil
}

// next gives the flusher its next stream: the tail's first incarnation
// (fenced is nil) or the one after fenced. It is the reincarnation, as one unit:
//
//  1. Read the chain. For the first incarnation, fence the chain's live one
//     (the previous process's, which may still be running) where it ends.
//  2. Pick the new incarnation: past every one the chain lists and every one
//     this instance's processes were given.
//  3. In one conditional write, end the old incarnation where its fence is and
//     make the new one live (Restart or Begin for the first, which drop the
//     previous process's marks; Reincarnate after a fence, which keeps them).
//  4. The write's chain marks the shards taken over: their pages fail, and
//     Taken is told.
//
// A write whose outcome is unknown, or that failed, is made again with the same
// incarnations until it lands: the flusher puts nothing meanwhile, so nothing is
// acknowledged in the new incarnation before the chain lists it. A chain whose
// live incarnation is another one (another process of the instance started) is
// the end: the flusher stops.
func (t *Tail) next(ctx context.Context, fenced *Stream) (*Stream, Taken, error) {
	b, inst := t.opts.Bucket, t.opts.Instance
	var (
		live, end uint64
		hasLive   bool
		n         uint64 // the new incarnation: picked once, with live and end
	)
	if fenced != nil {
		live, end, hasLive = fenced.Incarnation(), fenced.Next(), true
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-t.opts.Flush.Clock.After(t.opts.Flush.Retry):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		if n == 0 {
			c, _, err := ReadChain(ctx, b, inst)
			if err != nil {
				t.opts.Logger.Warn("tail: the chain could not be read; trying again", "instance", inst, "err", err)
				continue
			}
			if l, ok := c.Live(); ok && fenced == nil {
				seq, _, err := Fence(ctx, b, inst, l.N, 0)
				if err != nil {
					t.opts.Logger.Warn("tail: the previous incarnation could not be fenced; trying again", "instance", inst, "incarnation", l.N, "err", err)
					continue
				}
				live, end, hasLive = l.N, seq, true
			}
			last := live
			if k := len(c.Incarnations); k > 0 {
				last = max(last, c.Incarnations[k-1].N)
			}
			if n, err = t.opts.NextIncarnation(last); err != nil {
				return nil, nil, err
			}
		}
		var (
			c   Chain
			err error
		)
		switch {
		case fenced != nil && broken.Is(broken.UnlistedIncarnation):
			c, _, err = ReadChain(ctx, b, inst)
		case fenced != nil:
			c, err = Reincarnate(ctx, b, inst, live, end, n)
		case hasLive:
			c, err = Restart(ctx, b, inst, live, end, n)
		default:
			c, err = Begin(ctx, b, inst, n)
		}
		if errors.Is(err, ErrIncarnation) {
			return nil, nil, fmt.Errorf("%w: %w", ErrFenced, err)
		}
		if err != nil {
			t.opts.Logger.Warn("tail: the chain write of a new incarnation failed; trying again", "instance", inst, "incarnation", n, "err", err)
			continue
		}
		if fenced != nil {
			t.opts.Logger.Warn("tail: the stream was fenced by a takeover; carrying on in a new incarnation", "instance", inst, "old", live, "new", n)
		}
		return NewStream(b, inst, n, 0, t.writer), t.takenFrom(c), nil
	}
}

// takenFrom adds c's marks to those seen, tells Taken of the new ones, and
// returns what the flusher refuses from now on.
func (t *Tail) takenFrom(c Chain) Taken {
	t.mu.Lock()
	var fresh []Mark
	for _, m := range c.Marks {
		if !t.mu.taken[m] {
			t.mu.taken[m] = true
			fresh = append(fresh, m)
		}
	}
	taken := make(map[Mark]bool, len(t.mu.taken))
	for m := range t.mu.taken {
		taken[m] = true
	}
	t.mu.Unlock()
	if t.opts.Taken != nil {
		for _, m := range fresh {
			t.opts.Taken(m.Shard, m.Epoch)
		}
	}
	return func(shard string, epoch uint64) bool { return taken[Mark{Shard: shard, Epoch: epoch}] }
}
