package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/l0store/l0/internal/part"
)

const recordSize = 1024

func recordsFor(mb float64) int { return max(16, int(mb*1e6)/recordSize) }

func sealScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	recs := events(recordsFor(cfg.sealMB), recordSize, 1)
	var raw int64
	for _, r := range recs {
		raw += int64(len(r))
	}
	enc, err := part.NewEncoder(part.DefaultBlockSize, 1)
	if err != nil {
		return err
	}
	defer enc.Close()
	prog := newProgress("seal", 2*cfg.rounds)
	runs, err := runRounds(ctx, cfg.rounds, 2, prog, func(r, i int) (timed, error) {
		if i == 1 {
			return timeIt(func() error { compressAll(enc, recs); return nil })
		}
		d, err := runSeal(ctx, filepath.Join(root, fmt.Sprintf("seal-%d", r)), recs)
		if err != nil {
			return timed{}, fmt.Errorf("seal, round %d: %w", r, err)
		}
		return d, nil
	})
	prog.done()
	if err != nil {
		return err
	}
	rate := func(ts []timed) []float64 {
		return each(ts, func(t timed) float64 { return mbps(raw, t.wall) })
	}
	cpuPerMB := func(ts []timed) []float64 {
		return each(ts, func(t timed) float64 { return msPerMB(t.cpu, raw) })
	}
	sealRates, zstdRates := spreadOf(rate(runs[0])), spreadOf(rate(runs[1]))
	sealCPU, zstdCPU := spreadOf(cpuPerMB(runs[0])), spreadOf(cpuPerMB(runs[1]))
	vs := pairRatios(rate(runs[0]), rate(runs[1]))
	t := atLeast("seal MB/s over zstd's on one core", 0.8, vs.PerRound...)
	title(out, "seal", "%.1f MB of %d B JSON events → one part on a local directory, on one core · %d rounds, order rotated, each seal once the appends before it are shipped and written back · median (min-max)",
		float64(raw)/1e6, recordSize, cfg.rounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "contender\tMB/s\tvs zstd\tCPU ms / MB\t")
	fmt.Fprintf(tw, "l0 seal: WAL pages → part → put → manifest CAS → truncate\t%s\t%s\t%s\t\n", sealRates, vs, sealCPU)
	fmt.Fprintf(tw, "zstd SpeedFastest, 64 KiB blocks, 1 core\t%s\t1.00x\t%s\t\n", zstdRates, zstdCPU)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n", t)
	fmt.Fprintf(out, "%s\n\n", sealBoundNote(runs[0], runs[1]))
	return emit(results, resultLine{
		Scenario:  "seal",
		Params:    map[string]any{"raw_bytes": raw, "record_size": recordSize, "rounds": cfg.rounds, "substrate": "local"},
		Figures:   map[string]spread{"mb_per_s": sealRates, "cpu_ms_per_mb": sealCPU},
		Baselines: map[string]map[string]spread{"zstd_speedfastest_1core": {"mb_per_s": zstdRates, "cpu_ms_per_mb": zstdCPU}},
		Ratios:    map[string]paired{"mb_per_s_vs_zstd": vs},
		Targets:   []target{t},
	})
}

// timed is how long a run took, and the process's CPU time meanwhile.
type timed struct{ wall, cpu time.Duration }

// timeIt runs f and times it.
func timeIt(f func() error) (timed, error) {
	cpu0, _ := cpuUsed()
	start := time.Now()
	err := f()
	wall := time.Since(start)
	cpu1, _ := cpuUsed()
	return timed{wall: wall, cpu: cpu1 - cpu0}, err
}

// sealBoundNote splits the seal's time, in medians over the rounds, into what its
// CPU costs and the rest, which it spends waiting (the part's sync, the manifest's
// compare-and-swap): the CPU part alone bounds it at zstd's time over its CPU time.
func sealBoundNote(seal, zstd []timed) string {
	median := func(ts []timed, f func(timed) time.Duration) time.Duration {
		return time.Duration(spreadOf(each(ts, func(t timed) float64 { return float64(f(t)) })).Median)
	}
	wall := func(t timed) time.Duration { return t.wall }
	cpu := func(t timed) time.Duration { return t.cpu }
	sw, sc, zw := median(seal, wall), median(seal, cpu), median(zstd, wall)
	waited := max(sw-sc, 0)
	return fmt.Sprintf("note: a seal took %.1f ms: %.1f ms of CPU (zstd alone: %.1f ms for the same bytes) and %.1f ms waiting for the disk (the part's sync, the manifest's compare-and-swap); its CPU alone bounds it at %.2fx zstd",
		ms(sw), ms(sc), ms(zw), ms(waited), float64(zw)/float64(max(sc, 1)))
}

func inheritedScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	g, err := startGCS()
	if err != nil {
		return err
	}
	defer g.stop()
	recs := events(recordsFor(cfg.inheritedMB), recordSize, 2)
	var raw int64
	for _, r := range recs {
		raw += int64(len(r))
	}
	prog := newProgress("inherit", cfg.rounds)
	var opens, openeds, directs []time.Duration
	var reqs []float64
	for r := range cfg.rounds {
		in, err := runInherited(ctx, filepath.Join(root, fmt.Sprintf("inherited-%d", r)), g, recs, r%2 == 1)
		if err != nil {
			return fmt.Errorf("inherited-seal, round %d: %w", r, err)
		}
		opens, openeds, directs = append(opens, in.open), append(openeds, in.opened), append(directs, in.direct)
		reqs = append(reqs, float64(in.requests))
		prog.step()
	}
	prog.done()
	toMs := func(ds []time.Duration) []float64 { return each(ds, func(d time.Duration) float64 { return ms(d) }) }
	openMs, openedMs, directMs := toMs(opens), toMs(openeds), toMs(directs)
	// After OpenShard returned: the seal of the backlog, to set beside the direct one.
	afterMs := make([]float64, len(opens))
	for i := range opens {
		afterMs[i] = ms(opens[i] - openeds[i])
	}
	vs := pairRatios(openMs, directMs)
	targets := []target{
		atMost("openshard_to_sealed_ms", 500, openMs...),
		atMost("openshard_to_sealed over a direct seal of the same backlog", 1.2, vs.PerRound...),
	}
	title(out, "inherited-seal", "%.1f MB left unsealed by Retire, below every trigger (age 1 h) · %s %s · %d rounds, the direct seal first in every other · median (min-max)",
		float64(raw)/1e6, g.kind, g.endpoint, cfg.rounds)
	tw := newTable(out)
	fmt.Fprintln(tw, "contender\tms\tvs direct\t")
	fmt.Fprintf(tw, "OpenShard on a new engine → backlog sealed\t%s\t%s\t\n", spreadOf(openMs), vs)
	fmt.Fprintf(tw, "  of which OpenShard, until it returned: the takeover's %s object-store requests\t%s\t\t\n", spreadOf(reqs).median(), spreadOf(openedMs))
	fmt.Fprintf(tw, "  of which the seal after it\t%s\t%s\t\n", spreadOf(afterMs), pairRatios(afterMs, directMs))
	fmt.Fprintf(tw, "direct seal of the same backlog\t%s\t1.00x\t\n", spreadOf(directMs))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "inherited-seal",
		Params:   map[string]any{"raw_bytes": raw, "record_size": recordSize, "rounds": cfg.rounds, "substrate": g.kind, "age_trigger_s": 3600},
		Figures: map[string]spread{"openshard_to_sealed_ms": spreadOf(openMs), "openshard_returned_ms": spreadOf(openedMs),
			"openshard_requests": spreadOf(reqs), "sealed_after_openshard_ms": spreadOf(afterMs)},
		Baselines: map[string]map[string]spread{"direct_seal": {"ms": spreadOf(directMs)}},
		Ratios:    map[string]paired{"openshard_to_sealed_vs_direct_seal": vs},
		Targets:   targets,
	})
}
