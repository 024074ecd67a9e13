package main

import (
	"math"
	"runtime/metrics"
	"slices"
	"time"
)

// schedLatencies is the Go runtime's histogram of how long goroutines waited,
// runnable, for a core: what an appender waits for after its sync returned, on
// top of the sync. A snapshot's difference with a later one covers what came
// between.
type schedLatencies struct {
	counts  []uint64
	buckets []float64 // seconds; len(counts)+1 boundaries
}

const schedMetric = "/sched/latencies:seconds"

func readSchedLatencies() schedLatencies {
	s := []metrics.Sample{{Name: schedMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return schedLatencies{}
	}
	h := s[0].Value.Float64Histogram()
	return schedLatencies{counts: slices.Clone(h.Counts), buckets: slices.Clone(h.Buckets)}
}

// quantileSince returns quantile q of the waits since the earlier snapshot from,
// as the upper bound of the bucket it falls in, and whether there were enough
// waits for it.
func (s schedLatencies) quantileSince(from schedLatencies, q float64) (time.Duration, bool) {
	if len(s.counts) == 0 || len(from.counts) != len(s.counts) {
		return 0, false
	}
	delta := make([]uint64, len(s.counts))
	var total uint64
	for i := range delta {
		delta[i] = s.counts[i] - from.counts[i]
		total += delta[i]
	}
	if total < uint64(minSamples(q)) {
		return 0, false
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, n := range delta {
		if seen += n; seen >= rank {
			upper := s.buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = s.buckets[i]
			}
			return time.Duration(upper * float64(time.Second)), true
		}
	}
	return 0, false
}
