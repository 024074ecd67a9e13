package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/replica"
)

// ErrClosed reports use of an Uploader after Close.
var ErrClosed = errors.New("replication: uploader closed")

// Job copies one part to the replicas that lack it.
type Job struct {
	Shard string
	// Key is the part's object key, the same on every replica.
	Key    string
	Size   int64
	CRC    uint32 // the part CRC, checked on every byte copied
	Source Source
	// Targets are the replicas to copy to.
	Targets []string
	// SealedAt is when the part was sealed in this process; zero for a backfill,
	// which therefore adds no seal-to-durable lag sample.
	SealedAt time.Time
	// Recorder records each copy in the shard's manifest: the owner of the shard
	// that queued the job. Required.
	Recorder Recorder
	// Done, if set, runs when the job ends, with nil once every target holds the
	// part and is recorded: the caller may then drop a local source file.
	Done func(error)
}

// Backfill reports a job for history: no seal time in this process.
func (j Job) Backfill() bool { return j.SealedAt.IsZero() }

// Recorder records in a shard's manifest that replica holds the part under key, and
// publishes it: a ownership.Owner does. A job carries its own, the owner of the
// shard that queued it, so a copy is recorded by that owner and no other: one that
// ends after the owner released the shard, or was fenced, stays unrecorded until a
// backfill.
type Recorder interface {
	AddReplica(ctx context.Context, key, replica string) error
}

// withDefaults returns o with the default of each field left zero.
func withDefaults(o replica.Options) replica.Options {
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Attempts <= 0 {
		o.Attempts = 5
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = 100 * time.Millisecond
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = max(5*time.Second, o.BackoffMin)
	}
	if o.TempDir == "" {
		o.TempDir = os.TempDir()
	}
	if o.BackfillRecordDelay == 0 {
		o.BackfillRecordDelay = time.Second
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 2 * time.Minute
	}
	return o
}

// Stats are the uploader's counters. Normal uploads (parts sealed in this process)
// and backfill uploads are counted apart.
type Stats struct {
	Uploads, UploadBytes                 uint64
	UploadLagMicrosTotal                 uint64 // seal → on every target, summed over parts
	DurableParts                         uint64 // parts whose lag is in the total
	BackfillUploads, BackfillUploadBytes uint64
	UploadFailures                       uint64 // jobs that gave up
}

// Uploader copies parts in the background with bounded workers, retries and backoff.
type Uploader struct {
	set    *Set
	opts   replica.Options
	fs     vfs.FS
	clock  clock.Clock
	wake   chan struct{} // a job was queued
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu struct {
		sync.Mutex
		closed  bool
		queue   []Job
		pending map[string]int        // part key → jobs queued or running
		shards  map[string]*shardJobs // shard → its jobs queued or running
		active  int
		idle    chan struct{} // closed when active drops to 0
		// backfills counts per shard the backfill jobs not done copying; copied is
		// closed when that count drops to 0.
		backfills map[string]int
		copied    map[string]chan struct{}
	}
	stats struct {
		uploads, bytes, lagMicros, durable, backfills, backfillBytes, failures atomic.Uint64
	}
}

// shardJobs counts one shard's jobs queued or running; idle is closed when the
// count drops to 0.
type shardJobs struct {
	n    int
	idle chan struct{}
}

// closedChan is the Idle of a shard with no job.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// NewUploader starts an uploader over set, configured by opts. The engine gives it
// its own file system, of opts.TempDir and of the parts' local files, and clock, of
// the seal-to-durable lag and of the backoff; nil means vfs.Default and clock.Real.
func NewUploader(set *Set, opts replica.Options, fsys vfs.FS, clk clock.Clock) *Uploader {
	if fsys == nil {
		fsys = vfs.Default
	}
	ctx, cancel := context.WithCancel(context.Background())
	u := &Uploader{
		set: set, opts: withDefaults(opts), fs: fsys, clock: clock.OrReal(clk),
		wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel,
	}
	u.mu.pending = map[string]int{}
	u.mu.shards = map[string]*shardJobs{}
	u.mu.backfills = map[string]int{}
	u.mu.copied = map[string]chan struct{}{}
	u.mu.idle = make(chan struct{})
	close(u.mu.idle)
	for range u.opts.Workers {
		u.wg.Go(u.work)
	}
	return u
}

// Enqueue queues jobs, all at once, without waiting: a seal must never wait for an
// upload. The queue holds job descriptions only, not parts. A backfill queues a
// shard's jobs in one call, so that their records wait for all of them.
func (u *Uploader) Enqueue(jobs ...Job) error {
	if len(jobs) == 0 {
		return nil
	}
	u.mu.Lock()
	if u.mu.closed {
		u.mu.Unlock()
		return ErrClosed
	}
	if u.mu.active == 0 {
		u.mu.idle = make(chan struct{})
	}
	for _, j := range jobs {
		u.mu.active++
		u.mu.pending[j.Key]++
		sj := u.mu.shards[j.Shard]
		if sj == nil {
			sj = &shardJobs{idle: make(chan struct{})}
			u.mu.shards[j.Shard] = sj
		}
		sj.n++
		if j.Backfill() {
			if u.mu.backfills[j.Shard]++; u.mu.backfills[j.Shard] == 1 {
				u.mu.copied[j.Shard] = make(chan struct{})
			}
		}
	}
	u.mu.queue = append(u.mu.queue, jobs...)
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
	return nil
}

// next takes the next queued job.
func (u *Uploader) next() (Job, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.mu.queue) == 0 {
		return Job{}, false
	}
	j := u.mu.queue[0]
	u.mu.queue = u.mu.queue[1:]
	if len(u.mu.queue) > 0 { // let another worker take the next one
		select {
		case u.wake <- struct{}{}:
		default:
		}
	}
	return j, true
}

func (u *Uploader) done(j Job, err error) {
	if j.Done != nil {
		j.Done(err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.mu.pending[j.Key]--; u.mu.pending[j.Key] == 0 {
		delete(u.mu.pending, j.Key)
	}
	sj := u.mu.shards[j.Shard]
	if sj.n--; sj.n == 0 {
		close(sj.idle)
		delete(u.mu.shards, j.Shard)
	}
	if u.mu.active--; u.mu.active == 0 {
		close(u.mu.idle)
	}
}

// Pending reports whether an upload of the part is queued or running.
func (u *Uploader) Pending(key string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mu.pending[key] > 0
}

// Busy reports whether an upload of the shard's parts is queued or running.
func (u *Uploader) Busy(shard string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mu.shards[shard] != nil
}

// Idle returns a channel closed once no upload of the shard's parts is queued or
// running, at once if none is: a shard's Close waits on it for its copies, which
// record their locations through its owner, before it releases the lease. Jobs
// queued while the shard has others keep it open; jobs queued after it is closed
// have a channel of their own.
func (u *Uploader) Idle(shard string) <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if sj := u.mu.shards[shard]; sj != nil {
		return sj.idle
	}
	return closedChan
}

// Flush waits until no upload is queued or running.
func (u *Uploader) Flush(ctx context.Context) error {
	u.mu.Lock()
	idle := u.mu.idle
	u.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the counters.
func (u *Uploader) Stats() Stats {
	return Stats{
		Uploads: u.stats.uploads.Load(), UploadBytes: u.stats.bytes.Load(),
		UploadLagMicrosTotal: u.stats.lagMicros.Load(), DurableParts: u.stats.durable.Load(),
		BackfillUploads: u.stats.backfills.Load(), BackfillUploadBytes: u.stats.backfillBytes.Load(),
		UploadFailures: u.stats.failures.Load(),
	}
}

// Close stops taking jobs, cancels the running ones, drops the queued ones (each
// told ErrClosed) and waits for the workers.
func (u *Uploader) Close() {
	u.mu.Lock()
	u.mu.closed = true
	queued := u.mu.queue
	u.mu.queue = nil
	u.mu.Unlock()
	u.cancel()
	u.wg.Wait()
	for _, j := range queued {
		u.copyingEnded(j)
		u.done(j, ErrClosed)
	}
}

// copyingEnded notes that j made every copy it will make.
func (u *Uploader) copyingEnded(j Job) {
	if !j.Backfill() {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.mu.backfills[j.Shard]--; u.mu.backfills[j.Shard] == 0 {
		close(u.mu.copied[j.Shard])
		delete(u.mu.backfills, j.Shard)
		delete(u.mu.copied, j.Shard)
	}
}

// settle waits, for a backfill copy of j, until no other backfill copy of its shard
// is queued or running, or BackfillRecordDelay has passed.
func (u *Uploader) settle(j Job) {
	if !j.Backfill() || u.opts.BackfillRecordDelay < 0 {
		return
	}
	u.mu.Lock()
	copied, ok := u.mu.copied[j.Shard]
	u.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-copied:
	case <-u.clock.After(u.opts.BackfillRecordDelay):
	case <-u.ctx.Done():
	}
}

func (u *Uploader) work() {
	for {
		if j, ok := u.next(); ok {
			u.run(j)
			continue
		}
		select {
		case <-u.ctx.Done():
			return
		case <-u.wake:
		}
	}
}

// run copies j's part to each target and records each copy; a target that fails
// every attempt fails the job, which a later backfill repairs. The records
// are published while the worker goes on to its next copy (the owner groups the
// records that wait into one publish); a backfill's records first wait for the other
// backfill copies of the shard (replica.Options.BackfillRecordDelay). The job ends, and Flush
// sees it end, once they are published.
func (u *Uploader) run(j Job) {
	var (
		mu      sync.Mutex
		errs    []error
		records sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	// The source is read and checked once, for every target.
	var (
		src     *io.SectionReader
		cleanup func()
	)
	if err := u.retry(func(ctx context.Context) (err error) {
		src, cleanup, err = u.open(ctx, j)
		return err
	}); err != nil {
		u.copyingEnded(j)
		u.done(j, u.finish(j, err))
		return
	}
	defer cleanup()
	for _, target := range j.Targets {
		var made bool
		if err := u.retry(func(ctx context.Context) (err error) { made, err = u.copyTo(ctx, j, src, target); return err }); err != nil {
			fail(err)
			continue
		}
		// A copy that was there already is recorded, not counted: the counters say
		// what this uploader wrote.
		switch {
		case !made:
		case j.Backfill():
			u.stats.backfills.Add(1)
			u.stats.backfillBytes.Add(uint64(j.Size))
		default:
			u.stats.uploads.Add(1)
			u.stats.bytes.Add(uint64(j.Size))
		}
		records.Go(func() {
			u.settle(j)
			if err := u.retry(func(ctx context.Context) error { return j.Recorder.AddReplica(ctx, j.Key, target) }); err != nil {
				fail(fmt.Errorf("replication: record %s on %s: %w", j.Key, target, err))
			}
		})
	}
	u.copyingEnded(j)
	u.wg.Go(func() {
		records.Wait()
		u.done(j, u.finish(j, errors.Join(errs...)))
	})
}

// finish counts a job that ended with err (nil: every target holds and records the
// part).
func (u *Uploader) finish(j Job, err error) error {
	if err != nil {
		u.stats.failures.Add(1)
		return err
	}
	if !j.Backfill() {
		lag := u.clock.Now().Sub(j.SealedAt)
		u.stats.lagMicros.Add(uint64(max(0, lag.Microseconds())))
		u.stats.durable.Add(1)
		if u.opts.ObserveLag != nil {
			u.opts.ObserveLag(lag)
		}
	}
	return nil
}

func (u *Uploader) retry(f func(ctx context.Context) error) error {
	wait := u.opts.BackoffMin
	var err error
	for attempt := 0; attempt < u.opts.Attempts; attempt++ {
		ctx, cancel := context.WithTimeout(u.ctx, u.opts.AttemptTimeout)
		err = f(ctx)
		cancel()
		if err == nil || u.ctx.Err() != nil {
			return err
		}
		select {
		case <-u.clock.After(wait):
		case <-u.ctx.Done():
			return u.ctx.Err()
		}
		wait = min(2*wait, u.opts.BackoffMax)
	}
	return err
}

// copyTo puts j's part, src (opened and checked by open), on target, and reports
// whether it wrote it. An object already there counts as the copy (a re-driven
// upload re-states it) if its size matches.
func (u *Uploader) copyTo(ctx context.Context, j Job, src *io.SectionReader, target string) (made bool, err error) {
	dst, ok := u.set.Get(target)
	if !ok {
		return false, fmt.Errorf("replication: upload %s: no replica %q", j.Key, target)
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	_, created, err := dst.Bucket.PutIfAbsent(ctx, j.Key, src)
	if err != nil {
		return false, fmt.Errorf("replication: upload %s to %s: %w", j.Key, target, err)
	}
	if !created {
		a, err := dst.Bucket.Attributes(ctx, j.Key)
		if err != nil {
			return false, fmt.Errorf("replication: upload %s to %s: an object is there: %w", j.Key, target, err)
		}
		if a.Size != j.Size {
			return false, fmt.Errorf("replication: upload %s to %s: another object of %d bytes is there", j.Key, target, a.Size)
		}
	}
	return created, nil
}
