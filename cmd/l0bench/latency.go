package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// loadLevel is the latency of appends at one offered load.
type loadLevel struct {
	Fraction    float64 `json:"fraction_of_saturation"`
	OfferedMBps float64 `json:"offered_mb_per_s"`
	AchievedMBs float64 `json:"achieved_mb_per_s"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	P999Ms      float64 `json:"p999_ms"`
	// LateP50Ms and LateP99Ms are how late the load generator's timers woke for the
	// appends it slept for: part of the latency above, and not l0's doing (timers
	// wake late on a busy machine). Appends due while the appender still waited for
	// its previous one are not counted here: that wait is l0's.
	LateP50Ms float64 `json:"generator_late_p50_ms"`
	LateP99Ms float64 `json:"generator_late_p99_ms"`
}

var loadFractions = []float64{0.1, 0.25, 0.5, 0.75, 0.9}

// latencyScenario measures l0's saturation throughput (64 shards, -appenders), then
// offers fractions of it open-loop — each append is due at a set time, and its
// latency runs from that time, so a stall is not hidden by appenders that slowed down
// — and reports p50/p99/p99.9 per level beside the raw append+fdatasync latency of the
// same disk. The levels are drawn in an SVG.
func latencyScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	p := appendParams{appenders: cfg.appenders, recordSize: cfg.recordSize, batch: cfg.batch, duration: cfg.duration}
	prog := newProgress("latency", 2*3+len(loadFractions))
	var sat, raw []sample
	for r := range 3 {
		dir := filepath.Join(root, fmt.Sprintf("latency-sat-%d", r))
		os.MkdirAll(dir, 0o755)
		s, err := runL0(ctx, dir, p, 64)
		if err != nil {
			return err
		}
		sat = append(sat, s)
		prog.step()
		s, err = runRawAppend(dir, p)
		if err != nil {
			return err
		}
		raw = append(raw, s)
		prog.step()
		os.RemoveAll(dir)
	}
	saturation := median(sat, sample.mbps)
	rawP50 := median(raw, func(s sample) float64 { return ms(s.percentile(0.5)) })
	rawP99 := median(raw, func(s sample) float64 { return ms(s.percentile(0.99)) })

	var levels []loadLevel
	for i, f := range loadFractions {
		dir := filepath.Join(root, fmt.Sprintf("latency-%d", i))
		os.MkdirAll(dir, 0o755)
		lv, err := offeredLoad(ctx, dir, p, 64, f*saturation)
		os.RemoveAll(dir)
		if err != nil {
			return err
		}
		lv.Fraction = f
		levels = append(levels, lv)
		prog.step()
	}
	prog.done()
	half := levels[slices.IndexFunc(levels, func(l loadLevel) bool { return l.Fraction == 0.5 })]
	svgPath := strings.TrimSuffix(cfg.results, filepath.Ext(cfg.results)) + "-latency.svg"
	if err := os.WriteFile(svgPath, latencySVG(levels, rawP50, rawP99), 0o644); err != nil {
		return err
	}

	fmt.Fprintf(out, "latency · %d B records, %d per append, 64 shards · saturation %.1f MB/s · open-loop offered load, %s per level\n",
		p.recordSize, p.batch, saturation, p.duration)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "offered\tMB/s offered\tMB/s achieved\tp50 ms\tp99 ms\tp99.9 ms\ttimer late p50\tp99\t")
	for _, l := range levels {
		fmt.Fprintf(tw, "%.0f%%\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", 100*l.Fraction, l.OfferedMBps, l.AchievedMBs, l.P50Ms, l.P99Ms, l.P999Ms, l.LateP50Ms, l.LateP99Ms)
	}
	fmt.Fprintf(tw, "raw append+fdatasync, 1 writer\t-\t-\t%.2f\t%.2f\t-\t-\t-\t\n", rawP50, rawP99)
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintf(out, "at half load: p50 %.2fx raw (target ≤ 2x: %s), p99 %.2fx raw (target ≤ 3x: %s) · chart: %s\n\n",
		ratio(half.P50Ms, rawP50), verdict(half.P50Ms <= 2*rawP50), ratio(half.P99Ms, rawP99), verdict(half.P99Ms <= 3*rawP99), svgPath)
	return emit(results, resultLine{
		Scenario:  "latency",
		Params:    map[string]any{"shards": 64, "appenders": p.appenders, "record_size": p.recordSize, "batch": p.batch, "run_seconds": p.duration.Seconds(), "svg": svgPath},
		Figures:   map[string]any{"saturation_mb_per_s": saturation, "levels": levels},
		Baselines: map[string]map[string]float64{"raw_append_fdatasync": {"p50_ms": rawP50, "p99_ms": rawP99}},
		Ratios: map[string]float64{
			"half_load_p50_vs_raw_fdatasync": ratio(half.P50Ms, rawP50),
			"half_load_p99_vs_raw_fdatasync": ratio(half.P99Ms, rawP99),
		},
	})
}

// offeredLoad appends at mbps in all, from p.appenders appenders over shards shards,
// each append due at a fixed time; latency runs from the due time.
func offeredLoad(ctx context.Context, dir string, p appendParams, shards int, mbps float64) (loadLevel, error) {
	opened, closeAll, err := openShards(ctx, dir, "latency", shards)
	if err != nil {
		return loadLevel{}, err
	}
	defer closeAll()
	handles := opened.shards
	payloads := p.payloads()
	perAppender := time.Duration(float64(time.Second) * float64(p.batchBytes()) * float64(p.appenders) / (mbps * 1e6))
	start := time.Now().Add(10 * time.Millisecond)
	end := start.Add(p.duration)
	lats := make([][]time.Duration, p.appenders)
	lates := make([][]time.Duration, p.appenders)
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	for w := range p.appenders {
		wg.Go(func() {
			// Stagger the appenders over one interval so the load is smooth.
			due := start.Add(perAppender * time.Duration(w) / time.Duration(p.appenders))
			for ; due.Before(end); due = due.Add(perAppender) {
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
					lates[w] = append(lates[w], time.Since(due))
				}
				if _, err := handles[w%shards].Append(ctx, payloads[w]...); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				lats[w] = append(lats[w], time.Since(due))
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return loadLevel{}, firstErr
	}
	all, late := slices.Concat(lats...), slices.Concat(lates...)
	if len(all) == 0 {
		return loadLevel{}, fmt.Errorf("no append at %.1f MB/s", mbps)
	}
	q := func(ds []time.Duration, f float64) float64 { return ms(percentile(ds, f)) }
	return loadLevel{
		OfferedMBps: mbps,
		AchievedMBs: float64(len(all)) * float64(p.batchBytes()) / 1e6 / time.Since(start).Seconds(),
		P50Ms:       q(all, 0.5), P99Ms: q(all, 0.99), P999Ms: q(all, 0.999),
		LateP50Ms: q(late, 0.5), LateP99Ms: q(late, 0.99),
	}, nil
}

// latencySVG draws p50, p99 and p99.9 against offered load, on a log latency axis,
// with the raw fdatasync p50 and p99 as dashed lines.
func latencySVG(levels []loadLevel, rawP50, rawP99 float64) []byte {
	const w, h, left, right, top, bottom = 720.0, 420.0, 70.0, 150.0, 30.0, 50.0
	maxX := 0.0
	minY, maxY := math.Inf(1), 0.0
	for _, l := range levels {
		maxX = max(maxX, l.OfferedMBps)
		minY = min(minY, l.P50Ms, rawP50)
		maxY = max(maxY, l.P999Ms, rawP99)
	}
	lo, hi := math.Floor(math.Log10(max(minY, 0.01))), math.Ceil(math.Log10(max(maxY, 0.1)))
	if hi <= lo {
		hi = lo + 1
	}
	x := func(v float64) float64 { return left + (w-left-right)*v/maxX }
	y := func(v float64) float64 { return h - bottom - (h-top-bottom)*(math.Log10(max(v, 0.01))-lo)/(hi-lo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="14">l0 append latency against offered load (open loop)</text>`+"\n", left)
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
		name, color string
		f           func(loadLevel) float64
	}{
		{"p50", "#1f77b4", func(l loadLevel) float64 { return l.P50Ms }},
		{"p99", "#d62728", func(l loadLevel) float64 { return l.P99Ms }},
		{"p99.9", "#9467bd", func(l loadLevel) float64 { return l.P999Ms }},
	}
	for i, s := range series {
		var pts []string
		for _, l := range levels {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(l.OfferedMBps), y(s.f(l))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", s.color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s">l0 %s</text>`+"\n", w-right+10, top+20+18*float64(i), s.color, s.name)
	}
	for i, r := range []struct {
		name string
		v    float64
	}{{"raw fdatasync p50", rawP50}, {"raw fdatasync p99", rawP99}} {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="5,4"/>`+"\n", left, y(r.v), w-right, y(r.v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555">%s</text>`+"\n", w-right+10, top+80+18*float64(i), r.name)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
