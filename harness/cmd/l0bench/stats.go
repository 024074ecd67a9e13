package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// How rounds are run and summarized.
//
// Every scenario runs its contenders in rounds. Within a round each contender runs
// once, in an order that changes from round to round (see order), so that no
// contender always runs first on a fresh page cache, last on a tired disk, or
// right after the same neighbour. A figure is reported as the median of its rounds
// with their min and max; a ratio of a contender to its baseline is the median of
// the per-round ratios (each compares two runs a moment apart, so a machine that
// slows down for a while moves both sides), again with min and max, and the
// per-round values are in the results file.

// order is the order in which n contenders run in round r of rounds: the round
// starts at a contender chosen so that the starts spread evenly over the n, and
// goes up from it (0, 1, 2 ...) or, in every other round with more than two
// contenders, down (0, n-1, n-2 ...), so that each has different neighbours too.
func order(n, r, rounds int) []int {
	shift := r % n
	if rounds < n {
		shift = r * n / rounds
	}
	out := make([]int, n)
	for i := range out {
		if n > 2 && r%2 == 1 {
			out[i] = (shift - i + n) % n
		} else {
			out[i] = (i + shift) % n
		}
	}
	return out
}

// runRounds runs each of n contenders once per round, in the rotated order, and
// returns out[contender][round]. The first error stops it.
func runRounds[T any](ctx context.Context, rounds, n int, prog *progress, run func(round, contender int) (T, error)) ([][]T, error) {
	out := make([][]T, n)
	for i := range out {
		out[i] = make([]T, rounds)
	}
	for r := range rounds {
		for _, i := range order(n, r, rounds) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			v, err := run(r, i)
			if err != nil {
				return nil, err
			}
			out[i][r] = v
			prog.step()
		}
	}
	return out, nil
}

// spread is one figure over the rounds.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Rounds int     `json:"rounds"`
}

func spreadOf(vs []float64) spread {
	if len(vs) == 0 {
		return spread{}
	}
	return spread{Median: middle(slices.Clone(vs)), Min: slices.Min(vs), Max: slices.Max(vs), Rounds: len(vs)}
}

// String is "median (min-max)", or "-" without a round.
func (s spread) String() string {
	if s.Rounds == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s-%s)", num(s.Median), num(s.Min), num(s.Max))
}

// median is the median alone, or "-" without a round.
func (s spread) median() string {
	if s.Rounds == 0 {
		return "-"
	}
	return num(s.Median)
}

// paired is a ratio of a contender to its baseline, round by round.
type paired struct {
	spread
	PerRound []float64 `json:"per_round"`
	// Skipped are the rounds (from 0) with no ratio, left out of PerRound.
	Skipped []int `json:"skipped_rounds,omitempty"`
}

// pairRatios is num[r]/den[r] for every round r, summarized. A round in which
// either side is 0 — a quantile with too few samples behind it — has no ratio.
func pairRatios(num, den []float64) paired {
	var p paired
	for r := range min(len(num), len(den)) {
		if num[r] != 0 && den[r] != 0 {
			p.PerRound = append(p.PerRound, num[r]/den[r])
		} else {
			p.Skipped = append(p.Skipped, r)
		}
	}
	p.spread = spreadOf(p.PerRound)
	return p
}

// String is "0.91x (0.85-0.97)".
func (p paired) String() string {
	if p.Rounds == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", p.Median, p.Min, p.Max)
}

// num formats a figure with three significant digits or so.
func num(v float64) string {
	switch a := math.Abs(v); {
	case v == math.Trunc(v) && a < 1e12:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
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

// minSamples is how many samples a q-quantile needs before it is reported: ten
// beyond it (20 for p50, 1,000 for p99, 10,000 for p99.9). A p99 of 20 samples is
// their maximum, not a p99.
func minSamples(q float64) int { return int(math.Round(10 / (1 - q))) }

// quantile returns the q-quantile of ds — the smallest sample with at least q of
// the samples at or below it — and false when ds has too few samples for it. ds
// must be sorted.
func quantile(ds []time.Duration, q float64) (time.Duration, bool) {
	if len(ds) < minSamples(q) {
		return 0, false
	}
	return ds[max(0, int(math.Ceil(q*float64(len(ds))))-1)], true
}

// latencies summarizes a set of latency samples. A quantile with too few samples
// behind it is left out.
type latencies struct {
	Samples int      `json:"samples"`
	P50Ms   *float64 `json:"p50_ms,omitempty"`
	P90Ms   *float64 `json:"p90_ms,omitempty"`
	P99Ms   *float64 `json:"p99_ms,omitempty"`
	P999Ms  *float64 `json:"p999_ms,omitempty"`
	MaxMs   float64  `json:"max_ms"`
}

// roundQuantiles is the q-quantile of each round's samples in ms, 0 for a round
// with too few samples for it (which pairRatios and presentSpread leave out).
func roundQuantiles(rounds [][]time.Duration, q float64) []float64 {
	out := make([]float64, len(rounds))
	for i, ds := range rounds {
		s := slices.Clone(ds)
		slices.Sort(s)
		if d, ok := quantile(s, q); ok {
			out[i] = ms(d)
		}
	}
	return out
}

// presentSpread is the spread of the non-zero values of vs: the rounds that had
// enough samples for a quantile.
func presentSpread(vs []float64) spread {
	var present []float64
	for _, v := range vs {
		if v != 0 {
			present = append(present, v)
		}
	}
	return spreadOf(present)
}

// knownSpread is the spread of the values that are known, not negative.
func knownSpread(vs []float64) spread {
	var known []float64
	for _, v := range vs {
		if v >= 0 {
			known = append(known, v)
		}
	}
	return spreadOf(known)
}

func summarizeLatencies(ds []time.Duration) latencies {
	s := slices.Clone(ds)
	slices.Sort(s)
	l := latencies{Samples: len(s)}
	if len(s) > 0 {
		l.MaxMs = ms(s[len(s)-1])
	}
	for q, p := range map[float64]**float64{0.5: &l.P50Ms, 0.9: &l.P90Ms, 0.99: &l.P99Ms, 0.999: &l.P999Ms} {
		if d, ok := quantile(s, q); ok {
			v := ms(d)
			*p = &v
		}
	}
	return l
}

// cell formats a quantile for a table: "-" when there were too few samples.
func cell(v *float64) string {
	if v == nil {
		return "-"
	}
	return num(*v)
}

// value is the quantile, 0 when it was left out.
func value(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msPerMB is d, a CPU time, in milliseconds per MB of bytes.
func msPerMB(d time.Duration, bytes int64) float64 { return ms(d) / (float64(bytes) / 1e6) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// target is a performance target judged on its worst round, where the target is a
// bound: a figure that meets the bound in its median round but not its worst does
// not meet it.
type target struct {
	Name  string  `json:"name"`
	Bound string  `json:"bound"`
	Worst float64 `json:"worst"`
	Met   bool    `json:"met"`
	// Unjudged says why there was nothing to judge (too few samples): not met.
	Unjudged string `json:"unjudged,omitempty"`
}

// unjudged is a target the run could not judge, and why.
func unjudged(name, bound, why string) target {
	return target{Name: name, Bound: bound, Unjudged: why}
}

// bounded is atMost over vs, or a target not judged when there is nothing in vs.
func bounded(name string, bound float64, vs []float64, why string) target {
	if len(vs) == 0 {
		return unjudged(name, "≤ "+num(bound), why)
	}
	return atMost(name, bound, vs...)
}

// atLeast is a target met when the smallest of vs is at least bound.
func atLeast(name string, bound float64, vs ...float64) target {
	w := slices.Min(vs)
	return target{Name: name, Bound: fmt.Sprintf("≥ %s", num(bound)), Worst: w, Met: w >= bound}
}

// atMost is a target met when the largest of vs is at most bound.
func atMost(name string, bound float64, vs ...float64) target {
	w := slices.Max(vs)
	return target{Name: name, Bound: fmt.Sprintf("≤ %s", num(bound)), Worst: w, Met: w <= bound}
}

func (t target) String() string {
	if t.Unjudged != "" {
		return fmt.Sprintf("target %s %s: not judged, %s", t.Name, t.Bound, t.Unjudged)
	}
	v := "met"
	if !t.Met {
		v = "NOT met"
	}
	return fmt.Sprintf("target %s %s: worst %s, %s", t.Name, t.Bound, num(t.Worst), v)
}

// mbps is bytes over d in MB/s.
func mbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / 1e6 / d.Seconds()
}

// each applies f to every element of vs.
func each[T any](vs []T, f func(T) float64) []float64 {
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = f(v)
	}
	return out
}
