package engine

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/l0store/l0/internal/replication"
	"github.com/l0store/l0/internal/sealer"
	"github.com/l0store/l0/internal/tail"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

// Metrics is a snapshot of the engine's counters and of its shards.
type Metrics struct {
	// Appends, AppendedRecords and AppendedBytes count acknowledged appends and what
	// they carried; AppendDuration is the sum of their latencies.
	Appends         uint64
	AppendedRecords uint64
	AppendedBytes   uint64
	AppendDuration  time.Duration
	// AppendErrors counts failed appends by reason (see the reason label of
	// l0_append_errors_total).
	AppendErrors map[string]uint64
	// WALFsyncs counts the WAL's fsyncs; with concurrent appends it grows more slowly
	// than Appends, by the group commit. WALWrittenBytes counts the bytes of its
	// groups, and WALWriteTime and WALFsyncTime the time its flusher spent writing
	// and syncing them, each call's wait for a core after it returned included.
	WALFsyncs                  uint64
	WALWrittenBytes            uint64
	WALWriteTime, WALFsyncTime time.Duration
	// Seals, EmptySeals, SealFailures, Objects and SealedBytes count the seals of
	// all shards: those that sealed something, those that found nothing, failures,
	// objects written and record bytes sealed.
	Seals, EmptySeals, SealFailures, Objects, SealedBytes uint64
	// StrandedRecords counts acknowledged records an open dropped because another
	// instance had taken the shard over since (see DESIGN.md, "Ownership").
	StrandedRecords uint64
	// UnacknowledgedRecordsDropped counts, in Remote mode, the records an open
	// dropped for the same reason that were never acknowledged: their pages were
	// never shipped (a shipped page is in the next owner's history), and an append
	// is acknowledged only once its page is.
	UnacknowledgedRecordsDropped uint64
	// TailRecordsTaken counts the records takeovers read from a previous owner's
	// tail: what a move that was not a cooperative Close made the next owner
	// replay (a Close seals everything first, and leaves none).
	TailRecordsTaken uint64
	// Uploads count the copies of parts sealed in this process, and
	// BackfillUploads those of history; UploadLagMicrosTotal sums, over the parts
	// sealed here, the time from seal to a copy on every replica (backfills add
	// nothing to it).
	Uploads, UploadBytes, UploadLagMicrosTotal, DurableParts uint64
	BackfillUploads, BackfillUploadBytes, UploadFailures     uint64
	// TailPuts, TailBytes and TailPutFailures count the tail objects shipped, their
	// record bytes, and the puts that failed (each is retried); TailUnshippedBytes
	// is what the WAL holds that is not shipped yet. FencesWritten and FencesMet
	// count the takeovers that fenced a previous owner's tail, and those that found
	// it fenced already; TailObjectsCollected the tail objects deleted.
	TailPuts, TailBytes, TailPutFailures, TailUnshippedBytes uint64
	FencesWritten, FencesMet, TailObjectsCollected           uint64
	// Config is what the declared replica set promises.
	Config replica.Config
	// Data is what the open shards' parts say: how many lack a copy, how many of
	// those no upload will improve, whether every part survives losing one domain
	// (false while no part is known).
	Data replica.Durability
	// Shards has an entry for every open shard and every shard with unsealed
	// records in the WAL.
	Shards map[string]ShardMetrics
}

// ShardMetrics is one shard's state.
type ShardMetrics struct {
	// UnsealedBytes is the size of the shard's records not yet sealed.
	UnsealedBytes uint64
	// OldestUnsealed is when the oldest of them was appended; zero without any.
	OldestUnsealed time.Time
}

// Reasons of failed appends, the values of the reason label.
const (
	reasonInvalid  = "invalid"  // refused input: empty batch or record, too large
	reasonClosed   = "closed"   // the shard or engine was closed
	reasonCanceled = "canceled" // the context ended before the commit
	reasonFenced   = "fenced"   // the lease lapsed or another owner took over
	reasonWAL      = "wal"      // the WAL refused the append (it failed earlier)
	reasonUnknown  = "unknown"  // the records may have been written: the sync failed, or the lease ended during it
)

var reasons = []string{reasonInvalid, reasonClosed, reasonCanceled, reasonFenced, reasonWAL, reasonUnknown}

// metrics are the engine's collectors, fed by its events (see newEvents).
type metrics struct {
	e *Engine

	appends     prometheus.Counter
	records     prometheus.Counter
	bytes       prometheus.Counter
	duration    prometheus.Histogram
	errors      *prometheus.CounterVec
	commits     []prometheus.Collector // the WAL's group commits
	stranded    prometheus.Counter
	unacked     prometheus.Counter
	tailTaken   prometheus.Counter
	lag         prometheus.Histogram
	uploads     []prometheus.Collector
	seals       []prometheus.Collector
	tail        []prometheus.Collector
	fences      prometheus.Counter // fences this engine put on another's tail
	fencesMet   prometheus.Counter // fences it found in place
	collected   prometheus.Counter // tail objects deleted
	flushTook   prometheus.Histogram
	shipWait    prometheus.Histogram
	unsealed    *prometheus.Desc
	oldestAge   *prometheus.Desc
	lastCommits atomic.Pointer[wal.Commits] // the WAL's, kept for Metrics after Close

	registerer prometheus.Registerer
	registered []prometheus.Collector
}

func newMetrics(e *Engine) *metrics {
	m := &metrics{
		e: e,
		appends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "l0_append_total", Help: "Appends acknowledged (durable).",
		}),
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "l0_appended_records_total", Help: "Records in acknowledged appends.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "l0_appended_bytes_total", Help: "Record bytes in acknowledged appends.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "l0_append_duration_seconds",
			Help:    "Latency of acknowledged appends, from the call to durable.",
			Buckets: prometheus.ExponentialBucketsRange(50e-6, 10, 20),
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l0_append_errors_total",
			Help: "Appends that failed, by reason: invalid input, closed, canceled before the commit, fenced, refused by a failed wal; unknown: the records may have been written.",
		}, []string{"reason"}),
		unsealed: prometheus.NewDesc("l0_unsealed_bytes",
			"Bytes of a shard's records in the WAL, not yet sealed.", []string{"shard"}, nil),
		oldestAge: prometheus.NewDesc("l0_oldest_unsealed_age_seconds",
			"Age of a shard's oldest record not yet sealed; 0 without any.", []string{"shard"}, nil),
	}
	m.tailTaken = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "l0_takeover_tail_records_total",
		Help: "Records takeovers read from a previous owner's tail: what moves other than a cooperative close made the next owner replay.",
	})
	m.stranded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "l0_stranded_records_total",
		Help: "Acknowledged records dropped at an open because another instance had taken the shard over since. In Remote mode an acknowledged record is in the next owner's history, and this stays 0; see l0_unacknowledged_records_dropped_total.",
	})
	m.unacked = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "l0_unacknowledged_records_dropped_total",
		Help: "Records an open dropped, in Remote mode, because another instance had taken the shard over since, that were never acknowledged: their pages were never shipped. Not a loss.",
	})
	stat := func(name, help string, f func(sealer.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(e.sealer.Stats())) })
	}
	m.seals = []prometheus.Collector{
		stat("l0_seals_total", "Seals that sealed records.", func(s sealer.Stats) uint64 { return s.Seals }),
		stat("l0_empty_seals_total", "Seals that ran and found nothing to seal.", func(s sealer.Stats) uint64 { return s.EmptySeals }),
		stat("l0_seal_failures_total", "Seals that failed.", func(s sealer.Stats) uint64 { return s.Failures }),
		stat("l0_sealed_objects_total", "Objects written by seals.", func(s sealer.Stats) uint64 { return s.Objects }),
		stat("l0_sealed_bytes_total", "Record bytes sealed into parts.", func(s sealer.Stats) uint64 { return s.SealedBytes }),
	}
	m.lag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "l0_upload_lag_seconds",
		Help:    "Time from a part's seal to its copy on every replica, for parts sealed in this process.",
		Buckets: prometheus.ExponentialBucketsRange(0.001, 600, 20),
	})
	up := func(name, help string, f func(replication.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(e.uploader.Stats())) })
	}
	m.uploads = []prometheus.Collector{
		up("l0_uploads_total", "Copies of parts sealed in this process to a replica.", func(s replication.Stats) uint64 { return s.Uploads }),
		up("l0_upload_bytes_total", "Bytes of those copies.", func(s replication.Stats) uint64 { return s.UploadBytes }),
		up("l0_upload_lag_micros_total", "Seal to on-every-replica time summed over parts sealed in this process, in microseconds.", func(s replication.Stats) uint64 { return s.UploadLagMicrosTotal }),
		up("l0_backfill_uploads_total", "Copies of history (parts sealed before a replica was attached, or before a restart).", func(s replication.Stats) uint64 { return s.BackfillUploads }),
		up("l0_backfill_upload_bytes_total", "Bytes of those copies.", func(s replication.Stats) uint64 { return s.BackfillUploadBytes }),
		up("l0_upload_failures_total", "Upload jobs that gave up; a backfill repairs their parts.", func(s replication.Stats) uint64 { return s.UploadFailures }),
		m.lag, durabilityCollector{m},
	}
	m.fences = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "l0_tail_fences_written_total", Help: "Fences this engine put on a previous owner's tail stream at a takeover.",
	})
	m.fencesMet = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "l0_tail_fences_met_total", Help: "Takeovers that found the previous owner's tail stream fenced already.",
	})
	m.collected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "l0_tail_objects_collected_total", Help: "Tail objects deleted once no shard needed them (fences never are).",
	})
	m.flushTook = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "l0_tail_flush_duration_seconds",
		Help:    "Time to put one tail object, from its first attempt to the one that succeeded.",
		Buckets: prometheus.ExponentialBucketsRange(100e-6, 30, 20),
	})
	m.shipWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "l0_tail_ship_latency_seconds",
		Help:    "Time from a page entering the WAL to its tail object being durable: in Remote mode, the append's wait for the object store.",
		Buckets: prometheus.ExponentialBucketsRange(100e-6, 30, 20),
	})
	flush := func(name, help string, f func(tail.FlushStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return f(e.tail.Stats()) })
	}
	m.tail = []prometheus.Collector{
		flush("l0_tail_puts_total", "Tail objects shipped.", func(s tail.FlushStats) float64 { return float64(s.Puts) }),
		flush("l0_tail_bytes_total", "Record bytes shipped in tail objects.", func(s tail.FlushStats) float64 { return float64(s.Bytes) }),
		flush("l0_tail_put_failures_total", "Tail puts that failed (each is retried).", func(s tail.FlushStats) float64 { return float64(s.Failures) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "l0_tail_unshipped_bytes", Help: "Record bytes in the WAL not yet shipped to the tail: in Local mode, what losing the machine loses. After a fence it counts the pages waiting for the next incarnation to start.",
		}, func() float64 { return float64(e.tail.Stats().Pending) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "l0_tail_unshipped_age_seconds", Help: "Age of the oldest page not yet shipped to the tail; 0 without any.",
		}, func() float64 {
			if o := e.tail.Stats().Oldest; !o.IsZero() {
				return max(0, e.opts.Clock.Now().Sub(o).Seconds())
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "l0_wal_segments", Help: "WAL segment files: live ones hold unsealed pages (the current one included), recyclable ones wait to be written over.",
			ConstLabels: prometheus.Labels{"state": "live"},
		}, func() float64 { live, _ := e.log.Segments(); return float64(live) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "l0_wal_segments", Help: "WAL segment files: live ones hold unsealed pages (the current one included), recyclable ones wait to be written over.",
			ConstLabels: prometheus.Labels{"state": "recyclable"},
		}, func() float64 { _, pooled := e.log.Segments(); return float64(pooled) }),
		m.fences, m.fencesMet, m.collected, m.flushTook, m.shipWait,
	}
	commits := func(name, help string, f func(wal.Commits) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return f(m.walCommits()) })
	}
	m.commits = []prometheus.Collector{
		commits("l0_wal_fsyncs_total", "Fsyncs of the WAL; one serves many concurrent appends.",
			func(c wal.Commits) float64 { return float64(c.Groups) }),
		commits("l0_wal_written_bytes_total", "Bytes the WAL wrote in its group commits.",
			func(c wal.Commits) float64 { return float64(c.Bytes) }),
		commits("l0_wal_write_seconds_total", "Time the WAL's flusher spent in its writes, each one's wait for a core after it returned included.",
			func(c wal.Commits) float64 { return c.Write.Seconds() }),
		commits("l0_wal_fsync_seconds_total", "Time the WAL's flusher spent in its fsyncs, each one's wait for a core after it returned included: over l0_wal_fsyncs_total, the mean fsync.",
			func(c wal.Commits) float64 { return c.Sync.Seconds() }),
	}
	for _, r := range reasons {
		m.errors.WithLabelValues(r)
	}
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	m.registerer = reg
	all := append([]prometheus.Collector{m.appends, m.records, m.bytes, m.duration, m.errors, m.stranded, m.unacked, m.tailTaken, shardCollector{m}}, m.seals...)
	all = append(all, m.commits...)
	all = append(all, m.tail...)
	for _, c := range append(all, m.uploads...) {
		if err := reg.Register(c); err != nil {
			m.unregister()
			return errors.Join(ErrInvalidOptions, err)
		}
		m.registered = append(m.registered, c)
	}
	return nil
}

func (m *metrics) unregister() {
	c := m.walCommits()
	m.lastCommits.Store(&c)
	for _, c := range m.registered {
		m.registerer.Unregister(c)
	}
	m.registered = nil
}

func (m *metrics) walCommits() wal.Commits {
	if c := m.e.log.Commits(); c.Groups > 0 {
		return c
	}
	if c := m.lastCommits.Load(); c != nil {
		return *c
	}
	return wal.Commits{}
}

// observeShipped counts a tail object shipped (event.Listener.TailShipped).
func (m *metrics) observeShipped(s tail.ShipInfo) {
	m.flushTook.Observe(s.Took.Seconds())
	for _, w := range s.Waited {
		m.shipWait.Observe(w.Seconds())
	}
}

// fenceWritten counts a fence a takeover put (written) or found (met).
func (m *metrics) fenceWritten(written bool) {
	if written {
		m.fences.Inc()
	} else {
		m.fencesMet.Inc()
	}
}

// observeAppend counts an append (event.Listener.AppendEnded).
func (m *metrics) observeAppend(records, bytes int, took time.Duration, err error) {
	if err != nil {
		m.errors.WithLabelValues(reason(err)).Inc()
		return
	}
	m.appends.Inc()
	m.records.Add(float64(records))
	m.bytes.Add(float64(bytes))
	m.duration.Observe(took.Seconds())
}

func reason(err error) string {
	switch {
	case errors.Is(err, shard.ErrOutcomeUnknown):
		return reasonUnknown
	case errors.Is(err, shard.ErrEmptyBatch), errors.Is(err, shard.ErrEmptyRecord),
		errors.Is(err, shard.ErrRecordTooLarge), errors.Is(err, shard.ErrBatchTooLarge):
		return reasonInvalid
	case errors.Is(err, shard.ErrClosed), errors.Is(err, wal.ErrClosed):
		return reasonClosed
	case errors.Is(err, manifest.ErrFenced):
		return reasonFenced
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return reasonCanceled
	}
	return reasonWAL
}

// shards returns the ids of the open shards and of the shards with pages in the WAL.
func (m *metrics) shards() []string {
	ids := m.e.log.Shards()
	for _, sh := range m.e.openShards() {
		ids = append(ids, sh.ID())
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// Metrics returns a snapshot of the engine's metrics.
func (e *Engine) Metrics() Metrics {
	m := e.metrics
	var h dto.Metric
	_ = m.duration.Write(&h)
	out := Metrics{
		Appends:                      counterValue(m.appends),
		AppendedRecords:              counterValue(m.records),
		AppendedBytes:                counterValue(m.bytes),
		AppendDuration:               time.Duration(h.GetHistogram().GetSampleSum() * float64(time.Second)),
		AppendErrors:                 make(map[string]uint64, len(reasons)),
		StrandedRecords:              counterValue(m.stranded),
		UnacknowledgedRecordsDropped: counterValue(m.unacked),
		TailRecordsTaken:             counterValue(m.tailTaken),
		Shards:                       make(map[string]ShardMetrics),
	}
	c := m.walCommits()
	out.WALFsyncs, out.WALWrittenBytes, out.WALWriteTime, out.WALFsyncTime = c.Groups, c.Bytes, c.Write, c.Sync
	st := e.sealer.Stats()
	out.Seals, out.EmptySeals, out.SealFailures, out.Objects, out.SealedBytes = st.Seals, st.EmptySeals, st.Failures, st.Objects, st.SealedBytes
	us := e.uploader.Stats()
	out.Uploads, out.UploadBytes, out.UploadLagMicrosTotal, out.DurableParts = us.Uploads, us.UploadBytes, us.UploadLagMicrosTotal, us.DurableParts
	out.BackfillUploads, out.BackfillUploadBytes, out.UploadFailures = us.BackfillUploads, us.BackfillUploadBytes, us.UploadFailures
	ts := e.tail.Stats()
	out.TailPuts, out.TailBytes, out.TailPutFailures, out.TailUnshippedBytes = ts.Puts, ts.Bytes, ts.Failures, uint64(ts.Pending)
	out.FencesWritten, out.FencesMet, out.TailObjectsCollected = counterValue(m.fences), counterValue(m.fencesMet), counterValue(m.collected)
	out.Config, out.Data = e.set.Config(), e.durability()
	for _, r := range reasons {
		out.AppendErrors[r] = counterValue(m.errors.WithLabelValues(r))
	}
	for _, id := range m.shards() {
		info := e.log.Info(id)
		out.Shards[id] = ShardMetrics{UnsealedBytes: info.UnsealedBytes, OldestUnsealed: info.Oldest}
	}
	return out
}

func counterValue(c prometheus.Counter) uint64 {
	var d dto.Metric
	_ = c.Write(&d)
	return uint64(d.GetCounter().GetValue())
}

// shardCollector collects the per-shard gauges from the WAL's state when scraped,
// so the append path updates nothing for them.
type shardCollector struct{ m *metrics }

func (c shardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.unsealed
	ch <- c.m.oldestAge
}

func (c shardCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.m.e.opts.Clock.Now()
	for _, id := range c.m.shards() {
		info := c.m.e.log.Info(id)
		age := 0.0
		if !info.Oldest.IsZero() {
			age = max(0, now.Sub(info.Oldest).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(c.m.unsealed, prometheus.GaugeValue, float64(info.UnsealedBytes), id)
		ch <- prometheus.MustNewConstMetric(c.m.oldestAge, prometheus.GaugeValue, age, id)
	}
}

// durability assesses the parts of the open shards.
func (e *Engine) durability() replica.Durability {
	owners, _ := e.owners()
	var parts []replication.PartReplicas
	for _, o := range owners {
		parts = appendPartReplicas(parts, o.Manifest().Parts)
	}
	return e.set.Assess(parts, e.uploader.Pending)
}

// appendPartReplicas appends to dst where each of parts is held.
func appendPartReplicas(dst []replication.PartReplicas, parts []manifest.Part) []replication.PartReplicas {
	for _, p := range parts {
		dst = append(dst, replication.PartReplicas{Key: p.Key, Replicas: p.Replicas})
	}
	return dst
}

// durabilityCollector exposes the replica set's configuration and the parts' data
// durability, each named for what it is computed from.
type durabilityCollector struct{ m *metrics }

var (
	descConfigSize    = prometheus.NewDesc("l0_replica_config_size", "Replicas in the declared set: configuration, not data.", nil, nil)
	descConfigDomains = prometheus.NewDesc("l0_replica_config_domains", "Distinct failure domains in the declared set: configuration, not data.", nil, nil)
	descConfigSPOF    = prometheus.NewDesc("l0_replica_config_single_point_of_failure", "1 if one failure domain holds every declared replica: configuration, not data.", nil, nil)
	descDataParts     = prometheus.NewDesc("l0_data_parts", "Sealed parts of the open shards: the parts the data gauges are computed from.", nil, nil)
	descDataShort     = prometheus.NewDesc("l0_data_parts_under_replicated", "Parts of the open shards that some replica of the set lacks.", nil, nil)
	descDataStuck     = prometheus.NewDesc("l0_data_parts_under_replicated_unqueued", "Under-replicated parts with no upload queued: nothing improves them until a backfill.", nil, nil)
	descDataSurvives  = prometheus.NewDesc("l0_data_survives_domain_loss", "1 if l0_data_parts is at least 1 and every one of those parts has copies in two failure domains; 0 with no part known. It covers the open shards only: l0_fleet_scan_data_survives_domain_loss answers for every stored shard.", nil, nil)
)

func (c durabilityCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConfigSize, descConfigDomains, descConfigSPOF, descDataParts, descDataShort, descDataStuck, descDataSurvives} {
		ch <- d
	}
}

func (c durabilityCollector) Collect(ch chan<- prometheus.Metric) {
	cfg, d := c.m.e.set.Config(), c.m.e.durability()
	g := func(desc *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v)
	}
	g(descConfigSize, float64(cfg.Size))
	g(descConfigDomains, float64(cfg.DistinctDomains))
	g(descConfigSPOF, b2f(cfg.SinglePointOfFailure))
	g(descDataParts, float64(d.Parts))
	g(descDataShort, float64(d.UnderReplicated))
	g(descDataStuck, float64(d.Stuck))
	g(descDataSurvives, b2f(d.SurvivesDomainLoss))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
