package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/l0store/l0/engine"
)

// openScenario builds a shard with -open-parts-mb of records sealed into 64 MB parts
// on a local-directory bucket and -open-wal-mb more left unsealed by Retire, then
// times a new engine's Open and OpenShard, and a replay of the whole shard (parts,
// then WAL) with its MB/s. Not in the default suite: building 1 GB takes a while.
func openScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	dir := filepath.Join(root, "open")
	bucket, err := localBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		return err
	}
	defer bucket.Close()
	recs := events(4096, recordSize, 8) // 4 MB, appended again and again
	var rawBytes int64
	for _, r := range recs {
		rawBytes += int64(len(r))
	}
	e, err := engine.Open(ctx, engine.Options{Dir: filepath.Join(dir, "engine"), Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("open")})
	if err != nil {
		return err
	}
	sh, err := e.OpenShard(ctx, "big")
	if err != nil {
		e.Close()
		return err
	}
	prog := newProgress("open", int(math.Ceil(cfg.openPartsMB/64))+2)
	appendMB := func(mb float64) error {
		for done := int64(0); float64(done) < mb*1e6; done += rawBytes {
			if err := appendAll(ctx, sh, recs); err != nil {
				return err
			}
		}
		return nil
	}
	for sealed := 0.0; sealed < cfg.openPartsMB; sealed += 64 {
		if err := appendMB(min(64, cfg.openPartsMB-sealed)); err != nil {
			e.Close()
			return err
		}
		if _, err := sh.Seal(ctx, 1<<40); err != nil {
			e.Close()
			return err
		}
		prog.step()
	}
	if err := appendMB(cfg.openWALMB); err != nil {
		e.Close()
		return err
	}
	parts := len(sh.Manifest().Parts)
	if err := sh.Retire(ctx); err != nil {
		e.Close()
		return err
	}
	if err := e.Close(); err != nil {
		return err
	}
	prog.step()

	start := time.Now()
	e, err = engine.Open(ctx, engine.Options{Dir: filepath.Join(dir, "engine"), Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("open")})
	if err != nil {
		return err
	}
	defer e.Close()
	engineOpen := time.Since(start)
	sh, err = e.OpenShard(ctx, "big")
	if err != nil {
		return err
	}
	shardOpen := time.Since(start) - engineOpen
	// The parts the replay reads: the seal of the inherited pages may add one while
	// it runs, and the baseline must not fetch it.
	sealed := sh.Manifest().Parts
	// The open armed the seal of the inherited 64 MB: it runs beside the replay, as
	// it would in production.
	replayStart := time.Now()
	var n, bytes int64
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			return err
		}
		n++
		bytes += int64(len(rec.Value))
	}
	replay := time.Since(replayStart)
	// The baseline: reading the same part objects whole through the same bucket.
	rawStart := time.Now()
	var objBytes int64
	for _, p := range sealed {
		data, _, err := bucket.Get(ctx, p.Key)
		if err != nil {
			return err
		}
		objBytes += int64(len(data))
	}
	rawRead := time.Since(rawStart)
	prog.step()
	prog.done()
	mbps := float64(bytes) / 1e6 / replay.Seconds()
	fmt.Fprintf(out, "open · a shard with %.0f MB of records in %d parts on a local-directory bucket and %.0f MB unsealed in the WAL\n",
		cfg.openPartsMB, parts, cfg.openWALMB)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure\tvalue\t")
	fmt.Fprintf(tw, "engine.Open (WAL recovery)\t%.1f ms\t\n", ms(engineOpen))
	fmt.Fprintf(tw, "OpenShard (lease, settle the WAL)\t%.1f ms\t\n", ms(shardOpen))
	fmt.Fprintf(tw, "replay of every record (%d records, %.0f MB)\t%.1f s, %.0f MB/s\t\n", n, float64(bytes)/1e6, replay.Seconds(), mbps)
	fmt.Fprintf(tw, "baseline: get every part object whole (%.0f MB stored)\t%.1f s; the replay takes %.1fx as long\t\n",
		float64(objBytes)/1e6, rawRead.Seconds(), ratio(replay.Seconds(), rawRead.Seconds()))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "open",
		Params:   map[string]any{"parts_mb": cfg.openPartsMB, "wal_mb": cfg.openWALMB, "parts": parts, "substrate": "local"},
		Figures: map[string]float64{"engine_open_ms": ms(engineOpen), "shard_open_ms": ms(shardOpen), "replay_s": replay.Seconds(),
			"replay_mb_per_s": mbps, "records": float64(n)},
		Baselines: map[string]map[string]float64{"get_part_objects": {"s": rawRead.Seconds(), "stored_bytes": float64(objBytes)}},
		Ratios:    map[string]paired{"replay_s_vs_get_part_objects_s": pairRatios([]float64{replay.Seconds()}, []float64{rawRead.Seconds()})},
	})
}
