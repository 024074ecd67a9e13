package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// loadFractions are the offered loads of the latency scenario, as fractions of
// l0's saturation, from the highest down: the high levels bring l0's WAL to the
// size at which it seals, so that every level is measured with seals running.
var loadFractions = []float64{0.9, 0.75, 0.5, 0.25, 0.1}

// levelRun is what one contender's run measured at every level.
type levelRun struct {
	levels []openLoop
	seals  []uint64 // l0's seals during each level
	capped bool     // the warm-up ended at its limit, not warm
}

// runLevels opens k in a fresh directory, offers it the highest load until it is
// warm (timing.warmedUp), then each level in turn: settle, then a window.
func runLevels(ctx context.Context, dir string, k sinkKind, p appendParams, rates []float64, t timing, win time.Duration) (levelRun, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return levelRun{}, err
	}
	defer removeAndSync(dir)
	s, err := k.open(ctx, dir, p)
	if err != nil {
		return levelRun{}, err
	}
	defer s.close()
	var run levelRun
	begin := time.Now()
	var acked int64
	for !t.warmedUp(s, time.Since(begin), acked) {
		if time.Since(begin) >= t.maxWarmup {
			run.capped = true
			break
		}
		lv, err := runOpen(ctx, s, p, rates[0], 0, min(time.Second, max(t.warmup/4, 50*time.Millisecond)))
		if err != nil {
			return levelRun{}, err
		}
		acked += int64(len(lv.lat)) * int64(p.batchBytes())
	}
	for _, rate := range rates {
		var before sealState
		if s.l0 != nil {
			before = s.l0.sealState()
		}
		lv, err := runOpen(ctx, s, p, rate, win/8, win)
		if err != nil {
			return levelRun{}, fmt.Errorf("latency %s at %.1f MB/s: %w", k.label(), rate, err)
		}
		run.levels = append(run.levels, lv)
		if s.l0 != nil {
			run.seals = append(run.seals, s.l0.sealState().seals-before.seals)
		}
	}
	return run, nil
}

// levelFigures are one contender's figures at one offered load: each quantile the
// median of the rounds' (for the rounds with enough samples), and the samples of
// every round pooled for the tail.
type levelFigures struct {
	Fraction     float64   `json:"fraction_of_saturation"`
	OfferedMBps  float64   `json:"offered_mb_per_s"`
	AchievedMBps spread    `json:"achieved_mb_per_s"`
	P50Ms        spread    `json:"p50_ms"`
	P99Ms        spread    `json:"p99_ms"`
	Pooled       latencies `json:"pooled"`
	TimerLate    latencies `json:"generator_timer_late"`
	Seals        *spread   `json:"seals,omitempty"` // l0's, in each round's level
}

func summarizeLevel(f float64, runs []levelRun, i int) levelFigures {
	var all, late []time.Duration
	var p50, p99, achieved []float64
	for _, r := range runs {
		lv := r.levels[i]
		all, late = append(all, lv.lat...), append(late, lv.late...)
		achieved = append(achieved, lv.achieved)
		l := summarizeLatencies(lv.lat)
		if l.P50Ms != nil {
			p50 = append(p50, *l.P50Ms)
		}
		if l.P99Ms != nil {
			p99 = append(p99, *l.P99Ms)
		}
	}
	lf := levelFigures{Fraction: f, OfferedMBps: runs[0].levels[i].offered, AchievedMBps: spreadOf(achieved),
		P50Ms: spreadOf(p50), P99Ms: spreadOf(p99), Pooled: summarizeLatencies(all), TimerLate: summarizeLatencies(late)}
	if len(runs[0].seals) > 0 {
		seals := spreadOf(each(runs, func(r levelRun) float64 { return float64(r.seals[i]) }))
		lf.Seals = &seals
	}
	return lf
}

// levelLats is every round's latencies at level i.
func levelLats(runs []levelRun, i int) [][]time.Duration {
	out := make([][]time.Duration, len(runs))
	for r, run := range runs {
		out[r] = run.levels[i].lat
	}
	return out
}

// latencyScenario measures l0's saturation on 64 shards in steady state, then, in
// rounds with the order rotated, offers l0 and the best raw writer the same
// open-loop loads — fractions of that saturation, from the same generator — and
// reports the latency quantiles of both and their per-round ratios; drawn in an SVG
// next to the results file.
func latencyScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	p := appendParams{appenders: cfg.appenders, recordSize: cfg.recordSize, batch: cfg.batch}
	const shards = 64
	rounds := cfg.longRounds
	kinds := []sinkKind{l0Kind(shards, cfg.l0Seal), bestRawKind}
	if haveMemoryStore() {
		kinds = append(kinds, l0OffDiskKind(shards, cfg.l0Seal))
	}
	prog := newProgress("latency", saturationRuns+rounds*len(kinds))
	var sats []float64
	for r := range saturationRuns {
		sat, err := runAppendOnce(ctx, filepath.Join(root, fmt.Sprint("latency-saturation-", r)), l0Kind(shards, cfg.l0Seal), p, cfg.timing)
		if err != nil {
			return err
		}
		sats = append(sats, sat.mbps())
		prog.step()
	}
	saturation := middle(sats)
	rates := make([]float64, len(loadFractions))
	for i, f := range loadFractions {
		rates[i] = f * saturation
	}
	runs, err := runRounds(ctx, rounds, len(kinds), prog, func(r, i int) (levelRun, error) {
		return runLevels(ctx, filepath.Join(root, fmt.Sprintf("latency-r%d-c%d", r, i)), kinds[i], p, rates, cfg.timing, cfg.latencyWindow)
	})
	prog.done()
	if err != nil {
		return err
	}
	rawRuns := runs[1]
	var rawLevels []levelFigures
	for i, f := range loadFractions {
		rawLevels = append(rawLevels, summarizeLevel(f, rawRuns, i))
	}
	// The embedded default, then, where there is one, l0 with its object store off
	// the WAL's disk, at the same offered loads.
	l0 := latencyVersus(runs[0], rawRuns, rawLevels, "l0", "")
	svgPath := strings.TrimSuffix(cfg.results, filepath.Ext(cfg.results)) + "-latency.svg"
	if err := os.WriteFile(svgPath, latencySVG(l0.levels, rawLevels), 0o644); err != nil {
		return err
	}
	title(out, "latency", "l0 in %s mode (-durability) · %d B records, %d per append, %d appenders, %d shards · l0 saturation %.1f MB/s (median of %d closed-loop runs in steady state) · open-loop offered load from one generator, l0 and the best raw writer in %d rounds, order rotated · %s per level, highest first, after a warm-up at the highest",
		durability, p.recordSize, p.batch, p.appenders, shards, saturation, saturationRuns, rounds, cfg.latencyWindow)
	if err := l0.print(out); err != nil {
		return err
	}
	ratios, targets := l0.ratios, l0.targets
	figures := map[string]any{"saturation_mb_per_s": saturation, "levels": l0.levels}
	if len(kinds) > 2 {
		off := latencyVersus(runs[2], rawRuns, rawLevels, "l0 with its object store off the WAL's disk", "off_disk_")
		fmt.Fprintf(out, "\n%s: the disk holds the WAL alone, as on a server whose object store is across the network; at the same offered loads, beside the same raw runs:\n", kinds[2].name)
		if err := off.print(out); err != nil {
			return err
		}
		maps.Copy(ratios, off.ratios)
		targets = append(targets, off.targets...)
		figures["off_disk_levels"] = off.levels
	}
	for _, rs := range runs {
		if slices.ContainsFunc(rs, func(r levelRun) bool { return r.capped }) {
			fmt.Fprintf(out, "note: a warm-up ended at its limit (%s) before the run was warm\n", cfg.timing.maxWarmup)
			break
		}
	}
	fmt.Fprintf(out, "latencies in ms; quantiles are medians of rounds, p99.9 of every round's samples pooled, \"-\" where there were too few samples · chart (l0 beside the WAL): %s\n\n", svgPath)
	return emit(results, resultLine{
		Scenario: "latency",
		Params: map[string]any{"shards": shards, "appenders": p.appenders, "record_size": p.recordSize, "batch": p.batch,
			"rounds": rounds, "level_window_s": cfg.latencyWindow.Seconds(), "svg": svgPath, "durability": durability.String()},
		Figures:   figures,
		Baselines: map[string]any{bestRaw: map[string]any{"levels": rawLevels}},
		Ratios:    ratios,
		Targets:   targets,
	})
}

// latencyResult is one l0 contender's levels beside the best raw writer's: its
// figures, its ratios to the raw writer (keys prefixed) and the half-load targets.
type latencyResult struct {
	name              string
	levels, rawLevels []levelFigures
	ratios            map[string]paired
	prefix            string
	targets           []target
}

func latencyVersus(runs, rawRuns []levelRun, rawLevels []levelFigures, name, prefix string) latencyResult {
	res := latencyResult{name: name, rawLevels: rawLevels, ratios: map[string]paired{}, prefix: prefix}
	for i, f := range loadFractions {
		res.levels = append(res.levels, summarizeLevel(f, runs, i))
		pct := fmt.Sprintf("%.0f", 100*f)
		res.ratios[prefix+"p50_at_"+pct+"pct_vs_"+bestRaw] = pairRatios(roundQuantiles(levelLats(runs, i), 0.5), roundQuantiles(levelLats(rawRuns, i), 0.5))
		res.ratios[prefix+"p99_at_"+pct+"pct_vs_"+bestRaw] = pairRatios(roundQuantiles(levelLats(runs, i), 0.99), roundQuantiles(levelLats(rawRuns, i), 0.99))
		if f == 0.5 {
			for _, q := range []string{"p50", "p99"} {
				res.targets = append(res.targets, bounded(name+" "+q+" at half load over the best raw writer's", 1.5,
					res.ratios[prefix+q+"_at_50pct_vs_"+bestRaw].PerRound, "too few appends per level for a "+q))
			}
		}
	}
	return res
}

// print writes the table of r's levels and its targets.
func (r latencyResult) print(out io.Writer) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "offered\tMB/s\tl0 MB/s done\tl0 seals\tl0 p50\tl0 p99\tl0 p99.9 pooled\traw p50\traw p99\tp50 vs raw\tp99 vs raw\tl0 timer late p99\t")
	unsealed := false
	for i, f := range loadFractions {
		l, raw := r.levels[i], r.rawLevels[i]
		pct := fmt.Sprintf("%.0f", 100*f)
		fmt.Fprintf(tw, "%s%%\t%.1f\t%s\t%s\t%s\t%s\t%s (n=%d)\t%s\t%s\t%s\t%s\t%s\t\n", pct, l.OfferedMBps, l.AchievedMBps.median(), l.Seals.median(),
			l.P50Ms.median(), l.P99Ms.median(), cell(l.Pooled.P999Ms), l.Pooled.Samples, raw.P50Ms.median(), raw.P99Ms.median(),
			r.ratios[r.prefix+"p50_at_"+pct+"pct_vs_"+bestRaw], r.ratios[r.prefix+"p99_at_"+pct+"pct_vs_"+bestRaw], cell(l.TimerLate.P99Ms))
		unsealed = unsealed || l.Seals.Min == 0
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.targets {
		fmt.Fprintln(out, t)
	}
	if unsealed {
		fmt.Fprintf(out, "note: in some rounds %s sealed nothing during a level, so that level does not show what seals cost\n", r.name)
	}
	return nil
}

// saturationRuns is how many steady-state closed-loop runs of l0 the latency
// scenario takes the median saturation of.
const saturationRuns = 2

// latencySVG draws l0's p50, p99 and p99.9 and the best raw writer's p50 and p99
// (dashed) against offered load, on a log latency axis.
func latencySVG(l0, raw []levelFigures) []byte {
	const w, h, left, right, top, bottom = 720.0, 420.0, 70.0, 170.0, 30.0, 50.0
	maxX := 0.0
	minY, maxY := math.Inf(1), 0.0
	for _, ls := range [][]levelFigures{l0, raw} {
		for _, l := range ls {
			maxX = max(maxX, l.OfferedMBps)
			if l.P50Ms.Median > 0 {
				minY = min(minY, l.P50Ms.Median)
			}
			maxY = max(maxY, l.P99Ms.Median, value(l.Pooled.P999Ms))
		}
	}
	lo, hi := math.Floor(math.Log10(max(minY, 0.01))), math.Ceil(math.Log10(max(maxY, 0.1)))
	if hi <= lo {
		hi = lo + 1
	}
	x := func(v float64) float64 { return left + (w-left-right)*v/max(maxX, 1e-9) }
	y := func(v float64) float64 { return h - bottom - (h-top-bottom)*(math.Log10(max(v, 0.01))-lo)/(hi-lo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14">append latency against offered load (open loop)</text>`+"\n", left)
	for e := lo; e <= hi; e++ {
		v := math.Pow(10, e)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%g ms</text>`+"\n",
			left, y(v), w-right, y(v), left-6, y(v)+4, v)
	}
	for i := 0; i <= 4; i++ {
		v := maxX * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f</text>`+"\n", x(v), h-bottom+18, v)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">offered MB/s</text>`+"\n", (left+w-right)/2, h-12)
	series := []struct {
		name, color, dash string
		levels            []levelFigures
		f                 func(levelFigures) float64
	}{
		{"l0 p50", "#1f77b4", "", l0, func(l levelFigures) float64 { return l.P50Ms.Median }},
		{"l0 p99", "#d62728", "", l0, func(l levelFigures) float64 { return l.P99Ms.Median }},
		{"l0 p99.9 (pooled)", "#9467bd", "", l0, func(l levelFigures) float64 { return value(l.Pooled.P999Ms) }},
		{"best raw p50", "#1f77b4", "5,4", raw, func(l levelFigures) float64 { return l.P50Ms.Median }},
		{"best raw p99", "#d62728", "5,4", raw, func(l levelFigures) float64 { return l.P99Ms.Median }},
	}
	for i, s := range series {
		var pts []string
		for _, l := range s.levels {
			if v := s.f(l); v > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(l.OfferedMBps), y(v)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", s.color, s.dash, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s">%s</text>`+"\n", w-right+10, top+20+18*float64(i), s.color, s.name)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
