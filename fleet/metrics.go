package fleet

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics a Membership registers, computed from Stats and Scans when
// collected.
var (
	descOwned       = prometheus.NewDesc("l0_fleet_owned_shards", "Shards the member has open.", nil, nil)
	descLeader      = prometheus.NewDesc("l0_fleet_leader", "1 while the member holds the leader lease.", nil, nil)
	descRevocations = prometheus.NewDesc("l0_fleet_revocations_total", "Handoffs of shards assigned elsewhere, by outcome: requested, cooperative (sealed and released within the drain deadline), forced (retired past it).", []string{"outcome"}, nil)
	descDrains      = prometheus.NewDesc("l0_fleet_drain_duration_seconds", "Time from a handoff's start to its release.", nil, nil)
	descReplayed    = prometheus.NewDesc("l0_fleet_replayed_records_total", "Records the member's opens read from a previous owner's tail: 0 while every handoff is cooperative.", nil, nil)
	descPublishes   = prometheus.NewDesc("l0_fleet_publishes_total", "Assignments the member published as leader.", nil, nil)
	descScanParts   = prometheus.NewDesc("l0_fleet_scan_data_parts", "Sealed parts of every stored shard of the scan shard, open anywhere or not, at its last pass.", []string{"scan"}, nil)
	descScanShort   = prometheus.NewDesc("l0_fleet_scan_data_parts_under_replicated", "Parts of the scan shard's stored shards that some replica lacks, at its last pass.", []string{"scan"}, nil)
	descScanSurvive = prometheus.NewDesc("l0_fleet_scan_data_survives_domain_loss", "1 if the scan shard's last pass found at least one part (l0_fleet_scan_data_parts) and every part of its stored shards has copies in two failure domains; 0 with no part found.", []string{"scan"}, nil)
	descScanBackf   = prometheus.NewDesc("l0_fleet_scan_backfilled_parts", "Parts the scan shard's last pass copied for shards nobody had open.", []string{"scan"}, nil)
	descScanOrphans = prometheus.NewDesc("l0_fleet_scan_orphan_parts_deleted", "Part objects no manifest names or ever will that the scan shard's last pass deleted.", []string{"scan"}, nil)
)

// collector exposes a Membership's metrics.
type collector struct{ m *Membership }

// drainBuckets are the drain histogram's upper bounds, in seconds.
var drainBuckets = prometheus.ExponentialBucketsRange(0.01, 60, 16)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOwned, descLeader, descRevocations, descDrains, descReplayed, descPublishes,
		descScanParts, descScanShort, descScanSurvive, descScanBackf, descScanOrphans} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.Stats()
	g := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	g(descOwned, prometheus.GaugeValue, float64(s.Owned))
	g(descLeader, prometheus.GaugeValue, b2f(s.Leader))
	g(descRevocations, prometheus.CounterValue, float64(s.Revocations), "requested")
	g(descRevocations, prometheus.CounterValue, float64(s.Cooperative), "cooperative")
	g(descRevocations, prometheus.CounterValue, float64(s.Forced), "forced")
	g(descReplayed, prometheus.CounterValue, float64(s.ReplayedRecords))
	g(descPublishes, prometheus.CounterValue, float64(s.Publishes))
	buckets := make(map[float64]uint64, len(drainBuckets))
	var sum float64
	for _, d := range s.Drains {
		sum += d.Seconds()
		for _, ub := range drainBuckets {
			if d.Seconds() <= ub {
				buckets[ub]++
			}
		}
	}
	ch <- prometheus.MustNewConstHistogram(descDrains, uint64(len(s.Drains)), sum, buckets)
	for k, r := range c.m.Scans() {
		scan := strconv.Itoa(k) + "/" + strconv.Itoa(r.Of)
		g(descScanParts, prometheus.GaugeValue, float64(r.Durability.Parts), scan)
		g(descScanShort, prometheus.GaugeValue, float64(r.Durability.UnderReplicated), scan)
		g(descScanSurvive, prometheus.GaugeValue, b2f(r.Durability.SurvivesDomainLoss), scan)
		g(descScanBackf, prometheus.GaugeValue, float64(r.Backfilled), scan)
		g(descScanOrphans, prometheus.GaugeValue, float64(r.OrphansDeleted), scan)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
