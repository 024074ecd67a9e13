package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/l0store/l0/replica"
)

func TestEverySeriesExistsAtZeroAndTheRegistryLintsClean(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	open(t, Options{Dir: t.TempDir(), Registerer: reg})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	want := `
# HELP l0_append_total Appends acknowledged (durable).
# TYPE l0_append_total counter
l0_append_total 0
# HELP l0_appended_bytes_total Record bytes in acknowledged appends.
# TYPE l0_appended_bytes_total counter
l0_appended_bytes_total 0
# HELP l0_appended_records_total Records in acknowledged appends.
# TYPE l0_appended_records_total counter
l0_appended_records_total 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "l0_append_total", "l0_appended_records_total", "l0_appended_bytes_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "l0_append_errors_total"); err != nil || n != len(reasons) {
		t.Fatalf("l0_append_errors_total has %d series (%v), want one per reason", n, err)
	}
	if n, err := testutil.GatherAndCount(reg, "l0_append_duration_seconds", "l0_wal_fsyncs_total", "l0_wal_written_bytes_total",
		"l0_wal_write_seconds_total", "l0_wal_fsync_seconds_total"); err != nil || n != 5 {
		t.Fatalf("duration and group commits: %d series (%v)", n, err)
	}
	tailSeries := []string{"l0_tail_puts_total", "l0_tail_bytes_total", "l0_tail_put_failures_total",
		"l0_tail_unshipped_bytes", "l0_tail_unshipped_age_seconds", "l0_tail_fences_written_total",
		"l0_tail_fences_met_total", "l0_tail_objects_collected_total"}
	for _, name := range tailSeries {
		if v := gathered(t, reg, name); v != 0 {
			t.Fatalf("%s is %v before anything happened", name, v)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "l0_tail_flush_duration_seconds", "l0_tail_ship_latency_seconds"); err != nil || n != 2 {
		t.Fatalf("tail histograms: %d series (%v)", n, err)
	}
}

func TestAppendsAreCountedInTheRegistryAndTheSnapshot(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	e := open(t, Options{Dir: t.TempDir(), Registerer: reg})
	sh := openShard(t, e, "orders-7")
	before := e.Metrics().WALFsyncs // the open records the owner epoch, synced
	for range 3 {
		if _, err := sh.Append(ctx, []byte("abc"), []byte("de")); err != nil {
			t.Fatal(err)
		}
	}
	sh.Append(ctx) // refused: counted as invalid
	m := e.Metrics()
	if m.Appends != 3 || m.AppendedRecords != 6 || m.AppendedBytes != 15 || m.AppendDuration <= 0 {
		t.Fatalf("snapshot: %+v", m)
	}
	// Each sequential append syncs once; pebble may add a sync of its own, and
	// records a sync's latency after it released the waiters, so the count read
	// right after an append may trail by one.
	if n := m.WALFsyncs - before; n < 2 || n > 5 {
		t.Fatalf("%d fsyncs for 3 sequential appends", n)
	}
	if m.WALWrittenBytes < 15 || m.WALFsyncTime <= 0 || m.WALWriteTime <= 0 {
		t.Fatalf("group commits: %d bytes written in %v, synced in %v", m.WALWrittenBytes, m.WALWriteTime, m.WALFsyncTime)
	}
	if got := gathered(t, reg, "l0_wal_fsync_seconds_total"); got <= 0 {
		t.Errorf("l0_wal_fsync_seconds_total = %v, want > 0", got)
	}
	if s := m.Shards["orders-7"]; s.UnsealedBytes != 15 || s.OldestUnsealed.IsZero() {
		t.Fatalf("shard snapshot: %+v", s)
	}
	// Remote mode: each sequential append waited for a tail object of its own.
	if m.TailPuts != 3 || m.TailBytes != 15 || m.TailUnshippedBytes != 0 {
		t.Fatalf("tail snapshot: %d puts, %d bytes, %d unshipped; want 3, 15, 0", m.TailPuts, m.TailBytes, m.TailUnshippedBytes)
	}
	// The flusher reports an object shipped after it releases the object's
	// appends: the last one's report may trail its acknowledgement.
	waitFor(t, 10*time.Second, "the third object's ship latency observed", func() bool {
		return histogramCount(t, reg, "l0_tail_ship_latency_seconds") >= 3
	})
	if n := histogramCount(t, reg, "l0_tail_ship_latency_seconds"); n != 3 {
		t.Fatalf("l0_tail_ship_latency_seconds counted %d pages, want 3", n)
	}
	for name, want := range map[string]float64{
		"l0_append_total": 3, "l0_appended_records_total": 6, "l0_appended_bytes_total": 15,
		"l0_tail_puts_total": 3, "l0_tail_bytes_total": 15,
	} {
		if got := gathered(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := testutil.ToFloat64(e.metrics.errors.WithLabelValues(reasonInvalid)); got != 1 {
		t.Errorf("invalid appends = %v, want 1", got)
	}
	want := `
# HELP l0_unsealed_bytes Bytes of a shard's records in the WAL, not yet sealed.
# TYPE l0_unsealed_bytes gauge
l0_unsealed_bytes{shard="orders-7"} 15
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "l0_unsealed_bytes"); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "l0_oldest_unsealed_age_seconds"); n != 1 {
		t.Fatalf("%d age series, want 1", n)
	}
}

// gathered returns the value of the counter name as the registry exposes it.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m := family(t, reg, name).GetMetric()[0]
	return m.GetCounter().GetValue() + m.GetGauge().GetValue() // one of them is set
}

// family is the metric family name in reg.
func family(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			return f
		}
	}
	t.Fatalf("%s not registered", name)
	return nil
}

func TestEnginesShareARegistererOneAfterAnother(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	dir := t.TempDir()
	e := open(t, Options{Dir: dir, Registerer: reg})
	other, err := Open(context.Background(), Options{Dir: t.TempDir(), Registerer: reg, Bucket: bucketFor(t, "other")})
	if !errors.Is(err, ErrInvalidOptions) {
		if other != nil {
			other.Close()
		}
		t.Fatalf("a second engine on the same registerer at once: %v, want ErrInvalidOptions", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	open(t, Options{Dir: dir, Registerer: reg})
}

// histogramCount is the sample count of histogram name in reg.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	return family(t, reg, name).GetMetric()[0].GetHistogram().GetSampleCount()
}

// TestAnEngineThatKnowsNoPartNeverClaimsSurvival: a fresh engine with a replica in
// a second domain has opened no shard, so it knows no part; its data gauge claims
// nothing, scrape after scrape, and says so beside the parts it knows.
func TestAnEngineThatKnowsNoPartNeverClaimsSurvival(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	open(t, Options{Dir: t.TempDir(), Registerer: reg, Replicas: []replica.Spec{
		{Name: "near", Domain: "node-a", Bucket: bucketFor(t, "near")},
		{Name: "far", Domain: "zone-b", Bucket: bucketFor(t, "far")},
	}})
	if got := gathered(t, reg, "l0_replica_config_domains"); got != 2 {
		t.Fatalf("l0_replica_config_domains = %v, want 2 (what this test is about changed)", got)
	}
	for i := range 3 {
		survives, parts := gathered(t, reg, "l0_data_survives_domain_loss"), gathered(t, reg, "l0_data_parts")
		if survives != 0 || parts != 0 {
			t.Fatalf("scrape %d: l0_data_survives_domain_loss = %v with l0_data_parts = %v", i, survives, parts)
		}
	}
}
