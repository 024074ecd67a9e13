package main

import (
	"fmt"
	"slices"
	"time"
)

// sample is one timed run of one contender.
type sample struct {
	ops     int // appends (batches) acknowledged
	records int
	bytes   int64
	elapsed time.Duration
	lat     []time.Duration // per acknowledged append
	fsyncs  uint64          // 0 when the contender does not know
}

func (s sample) mbps() float64                      { return float64(s.bytes) / 1e6 / s.elapsed.Seconds() }
func (s sample) recordsPerS() float64               { return float64(s.records) / s.elapsed.Seconds() }
func (s sample) percentile(p float64) time.Duration { return percentile(s.lat, p) }

// percentile returns the p-quantile (0 to 1) of ds, 0 when ds is empty.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// middle returns the median of vs, which it sorts; the mean of the two middle values
// when their number is even, and 0 when there are none.
func middle[T time.Duration | float64](vs []T) T {
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	if n := len(vs); n%2 == 0 {
		return (vs[n/2-1] + vs[n/2]) / 2
	}
	return vs[len(vs)/2]
}

// figures are the medians of a contender's samples across rounds.
type figures struct {
	MBps           float64 `json:"mb_per_s"`
	RecordsPerS    float64 `json:"records_per_s"`
	P50Ms          float64 `json:"ack_p50_ms"`
	P99Ms          float64 `json:"ack_p99_ms"`
	AppendsPerSync float64 `json:"appends_per_fsync,omitempty"`
	Rounds         int     `json:"rounds"`
}

func summarize(samples []sample) figures {
	f := figures{Rounds: len(samples)}
	f.MBps = median(samples, sample.mbps)
	f.RecordsPerS = median(samples, sample.recordsPerS)
	f.P50Ms = median(samples, func(s sample) float64 { return ms(s.percentile(0.50)) })
	f.P99Ms = median(samples, func(s sample) float64 { return ms(s.percentile(0.99)) })
	f.AppendsPerSync = median(samples, func(s sample) float64 {
		if s.fsyncs == 0 {
			return 0
		}
		return float64(s.ops) / float64(s.fsyncs)
	})
	return f
}

func median(samples []sample, f func(sample) float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	v := make([]float64, len(samples))
	for i, s := range samples {
		v[i] = f(s)
	}
	return middle(v)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// pairedRatio is the median over rounds of the throughput of a contender against its
// baseline in the same round (baseline time / contender time): each ratio compares
// runs a moment apart, so a machine that slows down for a while moves both sides.
func pairedRatio(contender, baseline []time.Duration) float64 {
	rs := make([]float64, 0, len(contender))
	for i := range contender {
		if contender[i] > 0 {
			rs = append(rs, baseline[i].Seconds()/contender[i].Seconds())
		}
	}
	return middle(rs)
}

// pairedNote says how the rounds of a paired scenario were run and summarized.
func pairedNote(rounds int) string {
	return fmt.Sprintf("%d rounds, contender and baseline in alternating order; figures are medians, the ratio the median of the rounds' ratios", rounds)
}
