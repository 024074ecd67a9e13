package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/vfs"
	pebblewal "github.com/cockroachdb/pebble/v2/wal"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

// A sink is what the appenders of a run append to: l0, or one of its baselines.
// Every sink makes an append durable (fdatasync'd) before it returns.
type sink struct {
	append func(w int) error // appender w appends its batch
	syncs  func() commits    // its group commits so far
	close  func() error
	l0     *l0Shards // for l0: its seals are measured beside its appends
	// warmBytes marks a contender whose state grows with what it is given, which
	// warms up by bytes as well as by time (timing.warmupBytes).
	warmBytes bool
}

// commits count a contender's group commits: its fsyncs, and the time its writer
// spent in the writes and in the fsyncs (-1 where it does not say).
type commits struct {
	fsyncs      uint64
	write, sync time.Duration
}

// timedCommits counts the commits of a raw writer, which times its own calls.
type timedCommits struct{ fsyncs, write, sync atomic.Uint64 }

// writeSync writes with write and syncs with sync, timing both.
func (c *timedCommits) writeSync(write, sync func() error) error {
	start := time.Now()
	err := write()
	wrote := time.Now()
	c.write.Add(uint64(wrote.Sub(start)))
	if err != nil {
		return err
	}
	err = sync()
	c.sync.Add(uint64(time.Since(wrote)))
	c.fsyncs.Add(1)
	return err
}

func (c *timedCommits) load() commits {
	return commits{fsyncs: c.fsyncs.Load(), write: time.Duration(c.write.Load()), sync: time.Duration(c.sync.Load())}
}

// sinkKind is a contender of the append and latency scenarios.
type sinkKind struct {
	key    string // its name in the results file
	name   string // its name in the tables
	shards int    // l0's shard count; 0 for the baselines
	// mode is l0's durability mode, as the results file names it.
	mode string
	// offDisk marks an l0 whose object store is off the WAL's disk (memoryStore).
	offDisk bool
	open    func(ctx context.Context, dir string, p appendParams) (*sink, error)
}

// The contenders' keys. The best raw writer is the limit every other contender is
// judged against.
const (
	bestRaw      = "best_raw_writer"
	serialRaw    = "raw_serial_writer"
	pebbleWAL    = "pebble_wal_recycled"
	pebbleOneKey = "pebble_db_one_key_per_append"
	pebble16Keys = "pebble_db_16_keys_per_append"
	l0WAL        = "l0_wal"
	l0Key        = "l0"
)

var (
	bestRawKind = sinkKind{key: bestRaw, name: "best raw writer: shared buffer, preallocated reused file", open: openBestRaw}
	serialKind  = sinkKind{key: serialRaw, name: "raw serial writer: one writer, growing file", open: openSerialRaw}
	walKind     = sinkKind{key: pebbleWAL, name: "pebble wal, recycled log files", open: openPebbleWAL}
	oneKeyKind  = sinkKind{key: pebbleOneKey, name: "pebble DB synced, one key per append", open: openPebbleDB(false)}
	l0WALKind   = sinkKind{key: l0WAL, name: "l0's WAL alone: 64 shards, no tail, truncated as sealed", open: openL0WAL}
	keys16Kind  = sinkKind{key: pebble16Keys, name: "pebble DB synced, 16 keys per append (extra)", open: openPebbleDB(true)}
)

// l0Kind is l0 on shards shards, sealing by triggers (the zero value: the
// defaults, as in production).
func l0Kind(shards int, triggers seal.Options) sinkKind {
	return l0KindIn(durability, shards, triggers)
}

// l0KindIn is l0Kind in durability mode d.
func l0KindIn(d engine.Durability, shards int, triggers seal.Options) sinkKind {
	name := "l0"
	if d != durability {
		name = fmt.Sprintf("l0 %s mode", d)
	}
	return sinkKind{key: l0Key, name: name, shards: shards, mode: d.String(), open: func(ctx context.Context, dir string, p appendParams) (*sink, error) {
		return openL0(ctx, dir, "", p, d, shards, triggers)
	}}
}

// l0OffDiskKind is l0Kind with its object store off the WAL's disk: a local
// directory in memory (memoryStore), as a server's object store is across the
// network, so that the disk holds the WAL alone, as it holds the raw writers'
// file, and only the CPU of shipping and sealing is shared. The embedded default
// (l0Kind) keeps the store beside the WAL, on the same disk.
func l0OffDiskKind(shards int, triggers seal.Options) sinkKind {
	return sinkKind{key: l0Key, name: "l0, object store off the WAL's disk (in memory)", shards: shards, mode: durability.String(), offDisk: true,
		open: func(ctx context.Context, dir string, p appendParams) (*sink, error) {
			store, err := os.MkdirTemp(memoryStore, "l0bench-store-")
			if err != nil {
				return nil, fmt.Errorf("the object store off the WAL's disk: %w", err)
			}
			s, err := openL0(ctx, dir, store, p, durability, shards, triggers)
			if err != nil {
				os.RemoveAll(store)
				return nil, err
			}
			closeL0 := s.close
			s.close = func() error {
				err := closeL0()
				os.RemoveAll(store)
				return err
			}
			return s, nil
		}}
}

// memoryStore is the file system in memory the off-disk contenders keep their
// object store on.
var memoryStore = "/dev/shm"

// haveMemoryStore reports whether memoryStore can hold a directory.
func haveMemoryStore() bool {
	d, err := os.MkdirTemp(memoryStore, "l0bench-probe-")
	if err != nil {
		return false
	}
	os.Remove(d)
	return true
}

// rawFileBytes is the size of the best raw writer's file, written once before the
// run and then overwritten in a ring.
const rawFileBytes = 64 << 20

// openBestRaw is the best raw writer we know for this workload: appenders copy
// their batch into a shared buffer, under a mutex, while one flusher writes and
// fdatasyncs the previous buffer; when the sync returns, the flusher swaps buffers
// and writes everything that gathered meanwhile. The file is preallocated and
// written in full before the run, and overwritten in a ring, so fdatasync never
// has to persist a new size or allocate. No format, no checksum, no index: the
// limit of this workload on this disk.
func openBestRaw(_ context.Context, dir string, p appendParams) (*sink, error) {
	f, err := os.OpenFile(filepath.Join(dir, "raw-ring"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	zero := make([]byte, 1<<20)
	for off := int64(0); off < rawFileBytes; off += int64(len(zero)) {
		if _, err := f.WriteAt(zero, off); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	type batch struct {
		done chan struct{}
		err  error
	}
	var (
		mu     sync.Mutex
		buf    []byte
		cur    = &batch{done: make(chan struct{})}
		kick   = make(chan struct{}, 1)
		quit   = make(chan struct{})
		exited = make(chan struct{})
		timed  timedCommits
	)
	go func() {
		defer close(exited)
		var off int64
		var spare []byte
		for {
			select {
			case <-kick:
			case <-quit:
				return
			}
			mu.Lock()
			if len(buf) == 0 {
				mu.Unlock()
				continue
			}
			data, b := buf, cur
			buf, cur = spare[:0], &batch{done: make(chan struct{})}
			mu.Unlock()
			if off+int64(len(data)) > rawFileBytes {
				off = 0
			}
			err := timed.writeSync(func() error { _, err := f.WriteAt(data, off); return err },
				func() error { return syscall.Fdatasync(int(f.Fd())) })
			off += int64(len(data))
			b.err = err
			close(b.done)
			spare = data
		}
	}()
	bufs := rawBatches(p)
	return &sink{
		append: func(w int) error {
			if len(bufs[w]) > rawFileBytes {
				return errors.New("a batch larger than the raw writer's file")
			}
			mu.Lock()
			buf = append(buf, bufs[w]...)
			b := cur
			mu.Unlock()
			select {
			case kick <- struct{}{}:
			default:
			}
			<-b.done
			return b.err
		},
		syncs: timed.load,
		close: func() error { close(quit); <-exited; return f.Close() },
	}, nil
}

// openSerialRaw is the raw writer l0bench used as its limit before: the appenders
// hand their batches to one writer, which gathers everything pending, copies it,
// writes it in one call and covers it with one fdatasync, on a file that grows.
// Nothing overlaps the sync, so it is not the limit; it stays for comparison.
func openSerialRaw(_ context.Context, dir string, p appendParams) (*sink, error) {
	f, err := os.OpenFile(filepath.Join(dir, "raw-serial"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	type req struct {
		buf  []byte
		done chan error
	}
	reqs := make(chan req, p.appenders)
	var timed timedCommits
	exited := make(chan struct{})
	go func() {
		defer close(exited)
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
			err := timed.writeSync(func() error { _, err := f.Write(buf); return err },
				func() error { return syscall.Fdatasync(int(f.Fd())) })
			for _, r := range pending {
				r.done <- err
			}
		}
	}()
	bufs := rawBatches(p)
	dones := make([]chan error, p.appenders)
	for w := range dones {
		dones[w] = make(chan error, 1)
	}
	return &sink{
		append: func(w int) error {
			reqs <- req{bufs[w], dones[w]}
			return <-dones[w]
		},
		syncs: timed.load,
		close: func() error { close(reqs); <-exited; return f.Close() },
	}, nil
}

// pebbleLogBytes is when the pebble wal contender moves to its next log file.
const pebbleLogBytes = 64 << 20

// openPebbleWAL writes each batch as one record through pebble's own log layer —
// the standalone WAL manager, record.LogWriter underneath — as pebble's commit
// pipeline does: records are added under a mutex, the log writer's flusher writes
// and syncs them in groups, and each appender waits for its sync. Log files roll
// at 64 MiB and the manager recycles up to 3 of them, so most writes overwrite
// allocated blocks.
func openPebbleWAL(_ context.Context, dir string, p appendParams) (*sink, error) {
	qsem := make(chan struct{}, record.SyncConcurrency-1)
	fsyncs := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fsync_seconds"})
	m, err := pebblewal.Init(pebblewal.Options{
		FsyncLatency:         fsyncs,
		Primary:              pebblewal.Dir{FS: vfs.Default, Dirname: dir},
		MaxNumRecyclableLogs: 3,
		PreallocateSize:      func() int { return pebbleLogBytes + pebbleLogBytes/10 },
		QueueSemChan:         qsem,
		Logger:               quietLogger{},
		EventListener:        walEvents{},
		WriteWALSyncOffsets:  func() bool { return false },
	}, nil)
	if err != nil {
		return nil, err
	}
	num := pebblewal.NumWAL(1)
	w, err := m.Create(num, 0)
	if err != nil {
		m.Close()
		return nil, err
	}
	var mu sync.Mutex
	bufs := rawBatches(p)
	return &sink{
		append: func(a int) error {
			var wg sync.WaitGroup
			var syncErr error
			wg.Add(1)
			mu.Lock()
			qsem <- struct{}{}
			off, err := w.WriteRecord(bufs[a], pebblewal.SyncOptions{Done: &wg, Err: &syncErr}, nil)
			if err == nil && off >= pebbleLogBytes {
				err = rollPebbleLog(m, &w, &num)
			}
			mu.Unlock()
			if err != nil {
				return err
			}
			wg.Wait()
			return syncErr
		},
		warmBytes: true,
		syncs:     func() commits { return histogramCommits(fsyncs) },
		close: func() error {
			mu.Lock()
			defer mu.Unlock()
			_, err := w.Close()
			return errors.Join(err, m.Close())
		},
	}, nil
}

// rollPebbleLog closes the log file w, hands it to the manager to recycle, and
// opens the next: what pebble does when a memtable flush makes a log obsolete.
func rollPebbleLog(m pebblewal.Manager, w *pebblewal.Writer, num *pebblewal.NumWAL) error {
	if _, err := (*w).Close(); err != nil {
		return err
	}
	*num++
	deletable, err := m.Obsolete(*num, false)
	if err != nil {
		return err
	}
	for _, d := range deletable {
		if err := d.FS.Remove(d.Path); err != nil {
			return err
		}
	}
	*w, err = m.Create(*num, 0)
	return err
}

type walEvents struct{}

func (walEvents) LogCreated(pebblewal.CreateInfo) {}

// pebbleKeep is how many of its latest appends each appender of the pebble DB
// contender keeps; older ones are deleted by range every pebbleKeep/4 appends, as
// l0 truncates what it has sealed, so that pebble's tree holds what l0's WAL holds
// (with 64 appenders of 16 KiB, 256 MiB) instead of growing for the whole run.
const pebbleKeep = 256

// openPebbleDB commits each batch to a pebble DB, synced, with the options l0's WAL
// uses: as one key per append, as l0 writes a page, or (keys16) one key per record.
func openPebbleDB(keys16 bool) func(context.Context, string, appendParams) (*sink, error) {
	return func(_ context.Context, dir string, p appendParams) (*sink, error) {
		db, err := pebble.Open(dir, &pebble.Options{
			FormatMajorVersion: pebble.FormatNewest,
			MemTableSize:       64 << 20,
			Logger:             quietLogger{},
		})
		if err != nil {
			return nil, err
		}
		payloads, bufs := p.payloads(), rawBatches(p)
		seq := make([]uint64, p.appenders)
		key := func(w int, n uint64) []byte {
			return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint16(nil, uint16(w)), n)
		}
		return &sink{
			append: func(w int) error {
				b := db.NewBatch()
				defer b.Close()
				n := seq[w]
				seq[w]++
				if !keys16 {
					if err := b.Set(key(w, n), bufs[w], nil); err != nil {
						return err
					}
				} else {
					for i, r := range payloads[w] {
						if err := b.Set(append(key(w, n), byte(i)), r, nil); err != nil {
							return err
						}
					}
				}
				if err := db.Apply(b, pebble.Sync); err != nil {
					return err
				}
				if n >= pebbleKeep && n%(pebbleKeep/4) == 0 {
					return db.DeleteRange(key(w, 0), key(w, n-pebbleKeep), pebble.NoSync)
				}
				return nil
			},
			syncs:     func() commits { return histogramCommits(db.Metrics().LogWriter.FsyncLatency) },
			warmBytes: true,
			close:     db.Close,
		}, nil
	}
}

// l0WALShards is how many shards the l0 WAL contender spreads its appenders over.
const l0WALShards = 64

// openL0WAL appends each batch as one page of l0's WAL, the engine's local log,
// without the engine: no tail to ship to and no seal to keep pace with, so that it
// shows what the log itself costs beside the raw writers. Appender w appends to
// shard w mod 64 and truncates its shard as pebble DB's contender deletes (what
// l0's seals do), so that sealed segments are recycled as in steady state.
func openL0WAL(_ context.Context, dir string, p appendParams) (*sink, error) {
	l, err := wal.Open(dir, wal.Options{})
	if err != nil {
		return nil, err
	}
	payloads := p.payloads()
	firsts := make([][]uint64, p.appenders) // each appender's offsets, appended in turn
	return &sink{
		append: func(w int) error {
			shard := fmt.Sprintf("s%02d", w%l0WALShards)
			first, err := l.Append(context.Background(), shard, 0, payloads[w])
			if err != nil {
				return err
			}
			// Its own offsets are page boundaries whatever other appenders of the
			// shard do, and a truncation below the floor is a no-op.
			firsts[w] = append(firsts[w], first)
			if n := len(firsts[w]); n >= pebbleKeep && n%(pebbleKeep/4) == 0 {
				through := firsts[w][n-pebbleKeep]
				firsts[w] = slices.Clone(firsts[w][n-pebbleKeep:])
				return l.TruncateThrough(shard, 0, through)
			}
			return nil
		},
		syncs: func() commits {
			c := l.Commits()
			return commits{fsyncs: c.Groups, write: c.Write, sync: c.Sync}
		},
		warmBytes: true,
		close:     l.Close,
	}, nil
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)           {}
func (quietLogger) Errorf(string, ...any)          {}
func (quietLogger) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

// rawBatches is each appender's batch as one buffer: what the raw writers write.
func rawBatches(p appendParams) [][]byte {
	payloads := p.payloads()
	out := make([][]byte, len(payloads))
	for w, recs := range payloads {
		for _, r := range recs {
			out[w] = append(out[w], r...)
		}
	}
	return out
}

// openL0 opens an engine in dir on a local-directory bucket in store (default: in
// dir), sealing by triggers, and shards shards on it; appender w appends to shard
// w mod shards.
func openL0(ctx context.Context, dir, store string, p appendParams, d engine.Durability, shards int, triggers seal.Options) (*sink, error) {
	if store == "" {
		store = dir
	}
	handles, closeAll, err := openShards(ctx, dir, store, "append", d, shards, triggers)
	if err != nil {
		return nil, err
	}
	payloads := p.payloads()
	return &sink{
		append: appendTo(ctx, handles.shards, func(w int) [][]byte { return payloads[w] }),
		syncs: func() commits {
			m := handles.engine.Metrics()
			return commits{fsyncs: m.WALFsyncs, write: m.WALWriteTime, sync: m.WALFsyncTime}
		},
		close:     func() error { closeAll(); return nil },
		l0:        &handles,
		warmBytes: true,
	}, nil
}

// l0Shards are shards open on an engine of the run.
type l0Shards struct {
	engine *engine.Engine
	shards []*shard.Shard
}

// openShards opens an engine in dir, on a local-directory bucket in store, and n
// shards on it; closeAll closes the engine and the bucket.
func openShards(ctx context.Context, dir, store, label string, d engine.Durability, n int, triggers seal.Options) (l0Shards, func(), error) {
	bucket, err := localBucket(filepath.Join(store, "bucket"))
	if err != nil {
		return l0Shards{}, nil, err
	}
	e, err := engine.Open(ctx, engine.Options{Durability: d, Dir: filepath.Join(dir, "engine"), Bucket: bucket, Seal: triggers, Registerer: engineRegisterer(label)})
	if err != nil {
		bucket.Close()
		return l0Shards{}, nil, err
	}
	closeAll := func() { e.Close(); bucket.Close() }
	shards, err := openEach(ctx, e, label, n)
	if err != nil {
		closeAll()
		return l0Shards{}, nil, err
	}
	return l0Shards{engine: e, shards: shards}, closeAll, nil
}

// openEach opens shards label-0 to label-(n-1) on e.
func openEach(ctx context.Context, e *engine.Engine, label string, n int) ([]*shard.Shard, error) {
	out := make([]*shard.Shard, n)
	for i := range out {
		var err error
		if out[i], err = e.OpenShard(ctx, fmt.Sprintf("%s-%d", label, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// appendTo is a sink's append: appender w appends batch(w) to shard w mod
// len(shards).
func appendTo(ctx context.Context, shards []*shard.Shard, batch func(w int) [][]byte) func(w int) error {
	return func(w int) error {
		_, err := shards[w%len(shards)].Append(ctx, batch(w)...)
		return err
	}
}

// sealState is what an engine has sealed and what it has left unsealed.
type sealState struct {
	seals, sealedBytes, appendedBytes uint64
	backlog                           uint64 // unsealed record bytes over every shard
}

func (h *l0Shards) sealState() sealState {
	m := h.engine.Metrics()
	s := sealState{seals: m.Seals, sealedBytes: m.SealedBytes, appendedBytes: m.AppendedBytes}
	for _, sh := range m.Shards {
		s.backlog += sh.UnsealedBytes
	}
	return s
}

// histogramCommits reads pebble's fsync latency histogram: its count is the
// fsyncs, its sum their time (pebble observes nanoseconds). Pebble does not time
// its writes apart.
func histogramCommits(h prometheus.Histogram) commits {
	var m dto.Metric
	if h == nil || h.Write(&m) != nil {
		return commits{write: -1, sync: -1}
	}
	return commits{fsyncs: m.GetHistogram().GetSampleCount(), write: -1, sync: time.Duration(m.GetHistogram().GetSampleSum())}
}
