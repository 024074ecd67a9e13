package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/seal"
)

// appendKinds are the append scenario's contenders: the best raw writer (the limit
// the others are judged against), the old serial raw writer, pebble's log layer,
// pebble DB written as l0 writes and, with extras, as l0bench once wrote it (16
// keys per append), l0's WAL without the engine, and l0 at each shard count; at
// the most shards, in the other durability mode and with its object store off the
// WAL's disk too.
func appendKinds(shardCounts []int, triggers seal.Options, extras bool) []sinkKind {
	ks := []sinkKind{bestRawKind, serialKind, walKind, oneKeyKind, l0WALKind}
	if extras {
		ks = append(ks, keys16Kind)
	}
	for i, n := range shardCounts {
		if i == len(shardCounts)-1 {
			// The other mode at the most shards, beside the mode of the run (the
			// last, which the target judges): Remote waits for the tail's put, on
			// the local directory here (see the tail scenario for a remote one).
			other := engine.Remote
			if durability == engine.Remote {
				other = engine.Local
			}
			ks = append(ks, l0KindIn(other, n, triggers))
			if haveMemoryStore() {
				ks = append(ks, l0OffDiskKind(n, triggers))
			}
		}
		ks = append(ks, l0Kind(n, triggers))
	}
	return ks
}

// onlyKinds keeps the best raw writer, which every ratio needs, and the kinds whose
// label contains only; with only empty, every kind.
func onlyKinds(ks []sinkKind, only string) []sinkKind {
	if only == "" {
		return ks
	}
	return slices.DeleteFunc(ks, func(k sinkKind) bool { return k.key != bestRaw && !strings.Contains(k.label(), only) })
}

// runAppendOnce opens k in a fresh directory under dir, runs the closed-loop
// workload on it, and removes the directory.
func runAppendOnce(ctx context.Context, dir string, k sinkKind, p appendParams, t timing) (window, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return window{}, err
	}
	defer removeAndSync(dir)
	s, err := k.open(ctx, dir, p)
	if err != nil {
		return window{}, err
	}
	w, err := runClosed(ctx, s, p, t)
	if cerr := s.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return window{}, fmt.Errorf("append %s: %w", k.label(), err)
	}
	return w, nil
}

func (k sinkKind) label() string {
	if k.shards > 0 {
		return fmt.Sprintf("%s, %d shards", k.name, k.shards)
	}
	return k.name
}

// appendFigures are one contender's figures over the rounds.
type appendFigures struct {
	MBps            spread `json:"mb_per_s"`
	AckP50Ms        spread `json:"ack_p50_ms"`
	AckP99Ms        spread `json:"ack_p99_ms"`
	AckSamples      int    `json:"ack_samples_per_round_min"`
	AppendsPerFsync spread `json:"appends_per_fsync"`
	// GroupMs is the window over its fsyncs, how often a group committed; WriteMs
	// and FsyncMs the writer's time per group in its write and in its fsync (a
	// wait for a core once the call returned included). The rest of GroupMs is the
	// writer waiting for appends, or for a core to take them.
	GroupMs spread `json:"group_commit_ms"`
	WriteMs spread `json:"group_write_ms"`
	FsyncMs spread `json:"group_fsync_ms"`
	// DiskPerAppended is the bytes the data's device wrote in the window over those
	// acknowledged: about 1 for a writer that writes each byte once.
	DiskPerAppended spread `json:"disk_written_per_appended"`
	// CPUMsPerMB is the process's CPU time in the window per MB acknowledged, and
	// CoresBusy that time over the window's length.
	CPUMsPerMB   spread `json:"cpu_ms_per_mb"`
	CoresBusy    spread `json:"cores_busy"`
	WindowS      spread `json:"window_s"`
	WarmupS      spread `json:"warmup_s"`
	WarmupCapped int    `json:"warmup_capped_rounds,omitempty"` // warm-ups that hit their limit
	// l0's seals inside the window: sealed bytes over appended bytes (about 1 when
	// seals keep pace), the seals, and the unsealed backlog at the end.
	SealedOverAppended *spread `json:"sealed_over_appended,omitempty"`
	Seals              *spread `json:"seals,omitempty"`
	BacklogEndMB       *spread `json:"backlog_end_mb,omitempty"`
	BacklogGrowthMB    *spread `json:"backlog_growth_mb,omitempty"`
}

// groupCommit is the group commit's cycle, and its write and fsync where timed:
// "0.95 (0.10, 0.80)".
func (f appendFigures) groupCommit() string {
	if f.GroupMs.Rounds == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s, %s)", f.GroupMs.median(), f.WriteMs.median(), f.FsyncMs.median())
}

// groupCommitNotes say, for each l0 contender whose WAL commits more slowly than
// the WAL alone does, where the difference is: in the write, in the fsync (each
// with its wait for a core once it returned), or between groups, the WAL's
// flusher waiting for appends or for a core. In the closed loop an append waits
// one to two cycles for its group, so the cycle bounds the rate. Remote mode's
// appends wait for the tail's put too, which sets their pace instead.
func groupCommitNotes(kinds []sinkKind, figs []appendFigures, alone appendFigures) []string {
	var notes []string
	rest := func(f appendFigures) float64 { return f.GroupMs.Median - f.WriteMs.Median - f.FsyncMs.Median }
	for i, k := range kinds {
		f := figs[i]
		if k.shards == 0 || k.mode == engine.Remote.String() || f.GroupMs.Rounds == 0 || f.WriteMs.Rounds == 0 || f.FsyncMs.Rounds == 0 || alone.FsyncMs.Rounds == 0 ||
			f.GroupMs.Median <= alone.GroupMs.Median {
			continue
		}
		notes = append(notes, fmt.Sprintf("%s: its WAL committed a group every %.2f ms against %.2f ms for the WAL alone: the write %+.2f ms, the fsync %+.2f ms (each with its wait for a core after it), between groups %+.2f ms (the flusher waiting for appends or for a core)",
			k.label(), f.GroupMs.Median, alone.GroupMs.Median, f.WriteMs.Median-alone.WriteMs.Median, f.FsyncMs.Median-alone.FsyncMs.Median, rest(f)-rest(alone)))
	}
	return notes
}

// lats is each round's ack latencies.
func lats(ws []window) [][]time.Duration {
	out := make([][]time.Duration, len(ws))
	for i, w := range ws {
		out[i] = w.lat
	}
	return out
}

func summarizeAppends(ws []window, l0 bool) appendFigures {
	f := appendFigures{
		MBps:            spreadOf(each(ws, window.mbps)),
		AckP50Ms:        presentSpread(roundQuantiles(lats(ws), 0.5)),
		AckP99Ms:        presentSpread(roundQuantiles(lats(ws), 0.99)),
		AckSamples:      int(slices.Min(each(ws, func(w window) float64 { return float64(len(w.lat)) }))),
		AppendsPerFsync: spreadOf(each(ws, window.appendsPerSync)),
		GroupMs:         presentSpread(each(ws, window.groupMs)),
		WriteMs:         knownSpread(each(ws, window.writeMs)),
		FsyncMs:         knownSpread(each(ws, window.fsyncMs)),
		DiskPerAppended: spreadOf(each(ws, window.diskPerAppended)),
		CPUMsPerMB:      spreadOf(each(ws, window.cpuMsPerMB)),
		CoresBusy:       spreadOf(each(ws, window.coresBusy)),
		WindowS:         spreadOf(each(ws, func(w window) float64 { return w.elapsed.Seconds() })),
		WarmupS:         spreadOf(each(ws, func(w window) float64 { return w.warmup.Seconds() })),
	}
	for _, w := range ws {
		if w.capped {
			f.WarmupCapped++
		}
	}
	if l0 {
		share := spreadOf(each(ws, window.sealedShare))
		seals := spreadOf(each(ws, func(w window) float64 { return float64(w.seals) }))
		end := spreadOf(each(ws, func(w window) float64 { return float64(w.backlogEnd) / 1e6 }))
		growth := spreadOf(each(ws, func(w window) float64 { return (float64(w.backlogEnd) - float64(w.backlogStart)) / 1e6 }))
		f.SealedOverAppended, f.Seals, f.BacklogEndMB, f.BacklogGrowthMB = &share, &seals, &end, &growth
	}
	return f
}

// sustainedShare is how far l0's sealed bytes may fall short of (or run ahead of)
// its appended bytes over a window for its rate to count as sustained: a shortfall
// is a backlog that grows without bound, a surplus a backlog still draining from
// the warm-up.
const sustainedShare = 0.1

// appendNotes are what the reader of the table must know to trust it: l0 runs
// whose seals did not keep pace with their appends (so their MB/s is not
// sustainable) or were still draining, and warm-ups cut short.
func appendNotes(kinds []sinkKind, figs []appendFigures, t timing) []string {
	var notes []string
	for i, k := range kinds {
		f := figs[i]
		if f.WarmupCapped > 0 {
			notes = append(notes, fmt.Sprintf("%s: in %d rounds the warm-up ended at its limit (%s) before the run was warm", k.label(), f.WarmupCapped, t.maxWarmup))
		}
		if k.shards == 0 || f.SealedOverAppended == nil {
			continue
		}
		switch share := f.SealedOverAppended.Median; {
		case share < 1-sustainedShare:
			notes = append(notes, fmt.Sprintf("%s: seals did not keep pace (sealed/appended %.2f, backlog %+.0f MB over the window): this rate is not sustainable", k.label(), share, f.BacklogGrowthMB.Median))
		case share > 1+sustainedShare:
			notes = append(notes, fmt.Sprintf("%s: the backlog was still draining (sealed/appended %.2f): the window is not in steady state", k.label(), share))
		}
	}
	return notes
}

// diskBoundNotes say, for each l0 contender that writes what it acknowledges more
// than once to the device the best raw writer writes it once to, the bound that
// puts on it: at the best raw writer's device rate, its MB/s can be at most that
// rate over the bytes it writes per byte appended.
func diskBoundNotes(kinds []sinkKind, figs []appendFigures, best appendFigures, vsBest []paired) []string {
	var notes []string
	for i, k := range kinds {
		per, bestPer := figs[i].DiskPerAppended.Median, best.DiskPerAppended.Median
		if k.shards == 0 || per <= 0 || bestPer <= 0 || vsBest[i].Rounds == 0 {
			continue
		}
		notes = append(notes, fmt.Sprintf("%s: the device wrote %.2f bytes per byte appended (the best raw writer %.2f), which bounds it at %.2fx the best raw writer by the disk's bandwidth alone; it reached %.2fx",
			k.label(), per, bestPer, bestPer/per, vsBest[i].Median))
	}
	return notes
}

// cpuBoundNotes say, for each l0 contender, the bound the machine's cores put on
// it: at the CPU time it spends per MB acknowledged, the cores allow at most
// cores over that MB/s, put as a ratio to the best raw writer's MB/s. A
// contender that keeps every core busy is at that bound: what it does per byte,
// not the disk, is what limits it.
func cpuBoundNotes(kinds []sinkKind, figs []appendFigures, best appendFigures, vsBest []paired) []string {
	var notes []string
	cores := float64(runtime.GOMAXPROCS(0))
	for i, k := range kinds {
		per := figs[i].CPUMsPerMB.Median
		if k.shards == 0 || per <= 0 || best.MBps.Median <= 0 || vsBest[i].Rounds == 0 {
			continue
		}
		bound := cores * 1000 / per
		notes = append(notes, fmt.Sprintf("%s: it spent %.1f CPU ms per MB appended (the best raw writer %.1f) and kept %.2f of %.0f cores busy; at that cost the cores allow at most %.0f MB/s, %.2fx the best raw writer; it reached %.2fx",
			k.label(), per, best.CPUMsPerMB.Median, figs[i].CoresBusy.Median, cores, bound, bound/best.MBps.Median, vsBest[i].Median))
	}
	return notes
}

// judgeAppends returns why a run is invalid: a contender faster than the best raw
// writer in its median round, so in most of the paired rounds, means the limit is
// not the limit on this machine, and no ratio to it means anything. A contender
// faster in fewer rounds is at the limit within the rounds' noise (a writer at
// 0.9x of it, on a disk whose fsyncs vary by a tenth from one window to the next,
// passes it in some round): a note says so, with its rounds.
func judgeAppends(kinds []sinkKind, vsBest []paired) (invalid string, notes []string) {
	var faster []string
	for i, k := range kinds {
		v := vsBest[i]
		if k.key == bestRaw || v.Rounds == 0 || v.Max <= 1 {
			continue
		}
		if v.Median > 1 {
			faster = append(faster, fmt.Sprintf("%s at %.2fx (%.2f-%.2f)", k.label(), v.Median, v.Min, v.Max))
			continue
		}
		above := 0
		for _, r := range v.PerRound {
			if r > 1 {
				above++
			}
		}
		notes = append(notes, fmt.Sprintf("%s was faster than the best raw writer in %d of %d rounds (up to %.2fx) and slower in the rest (median %.2fx): at the limit within the rounds' noise, not past it",
			k.label(), above, v.Rounds, v.Max, v.Median))
	}
	if len(faster) > 0 {
		invalid = "faster than the best raw writer in most rounds, which is then not the limit: " + strings.Join(faster, ", ")
	}
	return invalid, notes
}

func appendScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	return runAppends(ctx, cfg, onlyKinds(appendKinds(cfg.shards, cfg.l0Seal, cfg.extras), cfg.only), root, out, results)
}

// runAppends runs the append scenario with the contenders kinds, the best raw
// writer among them.
func runAppends(ctx context.Context, cfg config, kinds []sinkKind, root string, out, results io.Writer) error {
	p := appendParams{appenders: cfg.appenders, recordSize: cfg.recordSize, batch: cfg.batch}
	prog := newProgress("append", cfg.longRounds*len(kinds))
	wins, err := runRounds(ctx, cfg.longRounds, len(kinds), prog, func(r, i int) (window, error) {
		return runAppendOnce(ctx, filepath.Join(root, fmt.Sprintf("append-r%d-c%d", r, i)), kinds[i], p, cfg.timing)
	})
	prog.done()
	if err != nil {
		return err
	}
	return reportAppends(cfg, p, kinds, wins, out, results)
}

// reportAppends prints the append table and writes one result line per l0 shard
// count, each with every baseline.
func reportAppends(cfg config, p appendParams, kinds []sinkKind, wins [][]window, out, results io.Writer) error {
	at := func(key string) int { return slices.IndexFunc(kinds, func(k sinkKind) bool { return k.key == key }) }
	rates := make([][]float64, len(kinds))
	figs := make([]appendFigures, len(kinds))
	for i, k := range kinds {
		rates[i] = each(wins[i], window.mbps)
		figs[i] = summarizeAppends(wins[i], k.shards > 0)
	}
	vs := func(i int, key string) paired {
		if j := at(key); j >= 0 {
			return pairRatios(rates[i], rates[j])
		}
		return paired{}
	}
	vsBest := make([]paired, len(kinds))
	for i := range kinds {
		vsBest[i] = vs(i, bestRaw)
	}
	invalid, noise := judgeAppends(kinds, vsBest)

	title(out, "append", "%d B records, %d per append · %d appenders, closed loop · %d rounds, order rotated · warm-up ≥ %s, and for l0 and pebble until %.0f MB acknowledged (l0: and sealing), then a %s window · median (min-max) of rounds; ratios are medians of per-round ratios",
		p.recordSize, p.batch, p.appenders, cfg.longRounds, cfg.timing.warmup, float64(cfg.timing.warmupBytes)/1e6, cfg.timing.window)
	tw := newTable(out)
	fmt.Fprintln(tw, "contender\tshards\tMB/s\tack p50 ms\tack p99 ms\tappends/fsync\tgroup ms (write, fsync)\tdisk written / appended\tCPU ms / MB\tcores busy\tvs best raw\tvs pebble one key\tsealed/appended\tbacklog MB at end (growth)\t")
	for i, k := range kinds {
		f, shards, sealed, backlog := figs[i], "-", "-", "-"
		if k.shards > 0 {
			shards = strconv.Itoa(k.shards)
			sealed, backlog = f.SealedOverAppended.String(), fmt.Sprintf("%s (%+.0f)", f.BacklogEndMB.median(), f.BacklogGrowthMB.Median)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k.name, shards, f.MBps, f.AckP50Ms.median(), f.AckP99Ms.median(),
			f.AppendsPerFsync.median(), f.groupCommit(), f.DiskPerAppended.median(), f.CPUMsPerMB.median(), f.CoresBusy.median(), vsBest[i], vs(i, pebbleOneKey), sealed, backlog)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var targets []target
	if i := at(l0WAL); i >= 0 {
		targets = append(targets, atLeast("l0's WAL alone MB/s over the best raw writer's", 0.85, vsBest[i].PerRound...))
	}
	for i, k := range kinds {
		if k.offDisk {
			targets = append(targets, atLeast(fmt.Sprintf("l0 at %d shards, object store off the WAL's disk, MB/s over the best raw writer's", k.shards), 0.85, vsBest[i].PerRound...))
		}
	}
	if last := len(kinds) - 1; kinds[last].shards > 0 {
		targets = append(targets, atLeast(fmt.Sprintf("l0 at %d shards MB/s over the best raw writer's", kinds[last].shards), 0.85, vsBest[last].PerRound...))
	}
	for _, t := range targets {
		fmt.Fprintln(out, t)
	}
	for _, n := range appendNotes(kinds, figs, cfg.timing) {
		fmt.Fprintln(out, "note:", n)
	}
	if w := at(l0WAL); w >= 0 {
		for _, n := range groupCommitNotes(kinds, figs, figs[w]) {
			fmt.Fprintln(out, "note:", n)
		}
	}
	if b := at(bestRaw); b >= 0 {
		for _, n := range diskBoundNotes(kinds, figs, figs[b], vsBest) {
			fmt.Fprintln(out, "note:", n)
		}
		for _, n := range cpuBoundNotes(kinds, figs, figs[b], vsBest) {
			fmt.Fprintln(out, "note:", n)
		}
	}
	for _, n := range noise {
		fmt.Fprintln(out, "note:", n)
	}
	if invalid != "" {
		fmt.Fprintf(out, "INVALID RUN: %s\n", invalid)
	}
	fmt.Fprintln(out)

	baselines := map[string]appendFigures{}
	for i, k := range kinds {
		if k.shards == 0 {
			baselines[k.key] = figs[i]
		}
	}
	for i, k := range kinds {
		if k.shards == 0 {
			continue
		}
		line := resultLine{
			Scenario: "append",
			Params: map[string]any{
				"shards": k.shards, "durability": k.mode, "object_store": storePlace(k), "appenders": p.appenders, "record_size": p.recordSize, "batch": p.batch,
				"rounds": cfg.longRounds, "warmup_bytes": cfg.timing.warmupBytes, "warmup_s": cfg.timing.warmup.Seconds(), "window_s": cfg.timing.window.Seconds(),
			},
			Figures:   figs[i],
			Baselines: baselines,
			Ratios:    map[string]paired{},
			Invalid:   invalid,
		}
		for _, b := range kinds {
			if b.shards == 0 {
				line.Ratios["mb_per_s_vs_"+b.key] = vs(i, b.key)
			}
		}
		if i == len(kinds)-1 {
			line.Targets = targets
		}
		if err := emit(results, line); err != nil {
			return err
		}
	}
	return nil
}

// storePlace is where contender k keeps its object store, as the results file
// names it.
func storePlace(k sinkKind) string {
	if k.offDisk {
		return "memory, off the WAL's disk"
	}
	return "local directory beside the WAL"
}

// appendTiming is the default timing of closed-loop runs.
var appendTiming = timing{warmup: time.Second, maxWarmup: 20 * time.Second, window: 4 * time.Second, warmupBytes: 1500e6}
