package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

// appendParams describe one append workload: appenders goroutines, each appending
// batches of batch records of recordSize bytes, for duration.
type appendParams struct {
	appenders  int
	recordSize int
	batch      int
	duration   time.Duration
}

func (p appendParams) batchBytes() int { return p.recordSize * p.batch }

// payloads returns one batch of records per appender, random so nothing downstream
// compresses it away.
func (p appendParams) payloads() [][][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([][][]byte, p.appenders)
	for w := range out {
		out[w] = make([][]byte, p.batch)
		for i := range out[w] {
			r := make([]byte, p.recordSize)
			for j := range r {
				r[j] = byte(rng.Uint32())
			}
			out[w][i] = r
		}
	}
	return out
}

// drive runs op from appenders goroutines until the duration is over and times every
// call; the first error stops the run.
func drive(p appendParams, appenders int, op func(w int) error) (sample, error) {
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		stop     = make(chan struct{})
		lats     = make([][]time.Duration, appenders)
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; close(stop) })
	}
	start := time.Now()
	deadline := start.Add(p.duration)
	for w := range appenders {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				if err := op(w); err != nil {
					fail(err)
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	s := sample{elapsed: time.Since(start)}
	for _, l := range lats {
		s.lat = append(s.lat, l...)
	}
	s.ops = len(s.lat)
	s.records = s.ops * p.batch
	s.bytes = int64(s.ops) * int64(p.batchBytes())
	return s, firstErr
}

// runL0 appends through the engine to shards shards; appender w writes to shard
// w mod shards. The engine seals as it would in production (by its default
// triggers, to a local-directory bucket), so its seals share the machine.
func runL0(ctx context.Context, dir string, p appendParams, shards int) (sample, error) {
	handles, closeAll, err := openShards(ctx, dir, "append", shards)
	if err != nil {
		return sample{}, err
	}
	defer closeAll()
	e := handles.engine
	payloads := p.payloads()
	before := e.Metrics().WALFsyncs
	s, err := drive(p, p.appenders, func(w int) error {
		_, err := handles.shards[w%shards].Append(ctx, payloads[w]...)
		return err
	})
	s.fsyncs = e.Metrics().WALFsyncs - before
	return s, err
}

// l0Shards are shards open on an engine of the run.
type l0Shards struct {
	engine *engine.Engine
	shards []*shard.Shard
}

// openShards opens an engine in dir, on a local-directory bucket there, as it runs
// in production, and n shards on it; closeAll closes the engine and the bucket.
func openShards(ctx context.Context, dir, label string, n int) (l0Shards, func(), error) {
	bucket, err := localBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		return l0Shards{}, nil, err
	}
	e, err := engine.Open(ctx, engine.Options{Dir: filepath.Join(dir, "engine"), Bucket: bucket, Registerer: engineRegisterer(label)})
	if err != nil {
		bucket.Close()
		return l0Shards{}, nil, err
	}
	closeAll := func() { e.Close(); bucket.Close() }
	out := l0Shards{engine: e, shards: make([]*shard.Shard, n)}
	for i := range out.shards {
		if out.shards[i], err = e.OpenShard(ctx, fmt.Sprintf("%s-%d", label, i)); err != nil {
			closeAll()
			return l0Shards{}, nil, err
		}
	}
	return out, closeAll, nil
}

// runPebble commits the same batches straight to pebble, synced, with the options
// the WAL uses: what l0 would be without its page format, offsets and bookkeeping.
func runPebble(dir string, p appendParams) (sample, error) {
	db, err := pebble.Open(dir, &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		MemTableSize:       64 << 20,
		Logger:             quietLogger{},
	})
	if err != nil {
		return sample{}, err
	}
	defer db.Close()
	payloads := p.payloads()
	seq := make([]uint64, p.appenders)
	before := wal.PebbleSyncs(db)
	s, err := drive(p, p.appenders, func(w int) error {
		b := db.NewBatch()
		defer b.Close()
		for i, r := range payloads[w] {
			key := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint16(nil, uint16(w)), seq[w])
			if err := b.Set(append(key, byte(i)), r, nil); err != nil {
				return err
			}
		}
		seq[w]++
		return db.Apply(b, pebble.Sync)
	})
	s.fsyncs = wal.PebbleSyncs(db) - before
	return s, err
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)           {}
func (quietLogger) Errorf(string, ...any)          {}
func (quietLogger) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

// runRawAppend is one writer appending each batch's bytes to a file and calling
// fdatasync after each: the disk's latency floor for a durable append, and its
// throughput without any grouping.
func runRawAppend(dir string, p appendParams) (sample, error) {
	f, err := os.OpenFile(filepath.Join(dir, "raw"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return sample{}, err
	}
	defer f.Close()
	buf := concat(p.payloads()[0])
	s, err := drive(p, 1, func(int) error {
		if _, err := f.Write(buf); err != nil {
			return err
		}
		return syscall.Fdatasync(int(f.Fd()))
	})
	s.fsyncs = uint64(s.ops)
	return s, err
}

// runRawGroup is the ideal group commit on a raw file: the appenders hand their
// batches to one writer, which writes everything pending in one call and covers it
// with one fdatasync. No format, no index, no checksum: the physical limit of this
// workload on this disk.
func runRawGroup(dir string, p appendParams) (sample, error) {
	f, err := os.OpenFile(filepath.Join(dir, "raw-group"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return sample{}, err
	}
	defer f.Close()
	type req struct {
		buf  []byte
		done chan error
	}
	reqs := make(chan req, p.appenders)
	var fsyncs uint64
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		var pending []req
		var buf []byte
		for r := range reqs {
			pending, buf = append(pending[:0], r), append(buf[:0], r.buf...)
		drain:
			for {
				select {
				case r, ok := <-reqs:
					if !ok {
						break drain
					}
					pending, buf = append(pending, r), append(buf, r.buf...)
				default:
					break drain
				}
			}
			_, err := f.Write(buf)
			if err == nil {
				err = syscall.Fdatasync(int(f.Fd()))
				fsyncs++
			}
			for _, r := range pending {
				r.done <- err
			}
		}
	}()
	payloads := p.payloads()
	bufs := make([][]byte, p.appenders)
	dones := make([]chan error, p.appenders)
	for w := range bufs {
		bufs[w], dones[w] = concat(payloads[w]), make(chan error, 1)
	}
	s, err := drive(p, p.appenders, func(w int) error {
		reqs <- req{bufs[w], dones[w]}
		return <-dones[w]
	})
	close(reqs)
	<-writerDone
	s.fsyncs = fsyncs
	return s, err
}

func concat(recs [][]byte) []byte {
	var out []byte
	for _, r := range recs {
		out = append(out, r...)
	}
	return out
}

// contender is one line of the append table.
type contender struct {
	key    string // the name of its figures in the results file
	name   string // the name of its line in the table
	shards int    // 0 for the baselines, which have no shards
	run    func(ctx context.Context, dir string) (sample, error)
}

// The baselines' keys.
const (
	rawAppend = "raw_append_fdatasync"
	rawGroup  = "raw_group_commit"
	pebbleRaw = "pebble_synced_commits"
)

func appendContenders(p appendParams, shardCounts []int) []contender {
	cs := []contender{
		{key: rawAppend, name: "raw append+fdatasync, 1 writer", run: func(_ context.Context, dir string) (sample, error) { return runRawAppend(dir, p) }},
		{key: rawGroup, name: "raw group commit", run: func(_ context.Context, dir string) (sample, error) { return runRawGroup(dir, p) }},
		{key: pebbleRaw, name: "pebble synced commits", run: func(_ context.Context, dir string) (sample, error) { return runPebble(dir, p) }},
	}
	for _, n := range shardCounts {
		cs = append(cs, contender{key: "l0", name: "l0", shards: n, run: func(ctx context.Context, dir string) (sample, error) { return runL0(ctx, dir, p, n) }})
	}
	return cs
}

// runAppendScenario runs every contender once per round, interleaved, each in a
// fresh directory, and returns each contender's samples.
func runAppendScenario(ctx context.Context, root string, p appendParams, shardCounts []int, rounds int, progress *progress) ([]contender, [][]sample, error) {
	cs := appendContenders(p, shardCounts)
	samples := make([][]sample, len(cs))
	for r := range rounds {
		for i, c := range cs {
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
			dir := filepath.Join(root, fmt.Sprintf("append-r%d-c%d", r, i))
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, nil, err
			}
			s, err := c.run(ctx, dir)
			if rmErr := os.RemoveAll(dir); err == nil {
				err = rmErr
			}
			if err != nil {
				return nil, nil, fmt.Errorf("append %s (%d shards), round %d: %w", c.name, c.shards, r, err)
			}
			if s.ops == 0 {
				return nil, nil, errors.New("append " + c.name + ": no append completed")
			}
			samples[i] = append(samples[i], s)
			progress.step()
		}
	}
	return cs, samples, nil
}
