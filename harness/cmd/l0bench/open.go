package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
)

// openShardID is the shard the open scenario builds and opens.
const openShardID = "big"

// replay is one read of a whole shard's records.
type replay struct {
	records, bytes int64 // records and their bytes, as read
	took           time.Duration
}

func (r replay) mbps() float64 { return mbps(r.bytes, r.took) }

// openScenario builds a shard with -open-parts-mb of records sealed into 64 MB parts
// on a local-directory bucket and -open-wal-mb more left unsealed by Retire, then
// times a new engine's Open and OpenShard, and how long the seal of the inherited
// backlog that OpenShard arms takes. Once that is sealed it replays the whole shard,
// -rounds times, beside a baseline replay that does the same work without l0: get
// every part object and decode every record with the part reader. Not in the
// default suite: building 1 GB takes a while.
func openScenario(ctx context.Context, cfg config, root string, out, results io.Writer) error {
	dir := filepath.Join(root, "open")
	bucket, err := localBucket(filepath.Join(dir, "bucket"))
	if err != nil {
		return err
	}
	defer bucket.Close()
	engineDir := filepath.Join(dir, "engine")
	prog := newProgress("open", int(math.Ceil(cfg.openPartsMB/64))+1+2*cfg.rounds)
	appended, partsBefore, err := buildOpenShard(ctx, cfg, engineDir, bucket, prog)
	if err != nil {
		return err
	}

	start := time.Now()
	e, err := engine.Open(ctx, engine.Options{Durability: durability, Dir: engineDir, Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("open")})
	if err != nil {
		return err
	}
	defer e.Close()
	engineOpen := time.Since(start)
	sh, err := e.OpenShard(ctx, openShardID)
	if err != nil {
		return err
	}
	shardOpen := time.Since(start) - engineOpen
	if err := waitSealed(ctx, sh, time.Minute); err != nil {
		return err
	}
	toSealed := time.Since(start) - engineOpen
	parts := sh.Manifest().Parts

	reps, err := runRounds(ctx, cfg.rounds, 2, prog, func(r, i int) (replay, error) {
		if i == 1 {
			return replayParts(ctx, bucket, parts)
		}
		return replayShard(ctx, sh)
	})
	prog.done()
	if err != nil {
		return err
	}
	for r := range cfg.rounds {
		if l0, base := reps[0][r], reps[1][r]; l0.records != appended || base.records != l0.records {
			return fmt.Errorf("open, round %d: l0 replayed %d records and the baseline %d, of %d appended", r, l0.records, base.records, appended)
		}
	}
	l0Rates, baseRates := each(reps[0], replay.mbps), each(reps[1], replay.mbps)
	vs := pairRatios(l0Rates, baseRates)
	records, recordBytes := reps[0][0].records, reps[0][0].bytes

	title(out, "open", "a shard with %.0f MB of records in %d parts on a local-directory bucket and %.0f MB unsealed in the WAL · replays: %d rounds, order rotated · median (min-max)",
		cfg.openPartsMB, partsBefore, cfg.openWALMB, cfg.rounds)
	fmt.Fprintf(out, "both replays read the same %d part files after the inherited backlog is sealed, through the same OS page cache: they alternate, so both see it warm alike\n", len(parts))
	tw := newTable(out)
	fmt.Fprintln(tw, "figure\tvalue\tvs baseline\t")
	fmt.Fprintf(tw, "engine.Open (WAL recovery)\t%.1f ms\t-\t\n", ms(engineOpen))
	fmt.Fprintf(tw, "OpenShard (lease, settle the WAL)\t%.1f ms\t-\t\n", ms(shardOpen))
	fmt.Fprintf(tw, "OpenShard → inherited %.0f MB sealed\t%.1f ms\t-\t\n", cfg.openWALMB, ms(toSealed))
	fmt.Fprintf(tw, "l0 replay of every record (%d records, %.0f MB), MB/s\t%s\t%s\t\n", records, float64(recordBytes)/1e6, spreadOf(l0Rates), vs)
	fmt.Fprintf(tw, "baseline: get every part object, decode every record with internal/part, MB/s\t%s\t1.00x\t\n", spreadOf(baseRates))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return emit(results, resultLine{
		Scenario: "open",
		Params: map[string]any{"parts_mb": cfg.openPartsMB, "wal_mb": cfg.openWALMB, "parts_before_open": partsBefore, "parts_replayed": len(parts),
			"rounds": cfg.rounds, "substrate": "local", "page_cache": "warm for both, alternating"},
		Figures: map[string]any{"engine_open_ms": ms(engineOpen), "shard_open_ms": ms(shardOpen), "openshard_to_sealed_ms": ms(toSealed),
			"replay_mb_per_s": spreadOf(l0Rates), "records": records, "record_bytes": recordBytes},
		Baselines: map[string]map[string]spread{"get_and_decode_parts": {"mb_per_s": spreadOf(baseRates)}},
		Ratios:    map[string]paired{"replay_mb_per_s_vs_get_and_decode_parts": vs},
	})
}

// buildOpenShard appends -open-parts-mb of records to a new shard in dir, sealed
// every 64 MB, then -open-wal-mb more, and retires the shard with those unsealed. It
// returns how many records it appended and how many parts the shard has.
func buildOpenShard(ctx context.Context, cfg config, dir string, bucket *substrate.Bucket, prog *progress) (appended int64, parts int, err error) {
	recs := events(4096, recordSize, 8) // 4 MB, appended again and again
	var rawBytes int64
	for _, r := range recs {
		rawBytes += int64(len(r))
	}
	e, err := engine.Open(ctx, engine.Options{Durability: durability, Dir: dir, Bucket: bucket, Seal: quietSeal(), Registerer: engineRegisterer("open")})
	if err != nil {
		return 0, 0, err
	}
	defer e.Close()
	sh, err := e.OpenShard(ctx, openShardID)
	if err != nil {
		return 0, 0, err
	}
	appendMB := func(mb float64) error {
		for done := int64(0); float64(done) < mb*1e6; done += rawBytes {
			if err := appendAll(ctx, sh, recs); err != nil {
				return err
			}
			appended += int64(len(recs))
		}
		return nil
	}
	for sealed := 0.0; sealed < cfg.openPartsMB; sealed += 64 {
		if err := appendMB(min(64, cfg.openPartsMB-sealed)); err != nil {
			return 0, 0, err
		}
		if _, err := sh.Seal(ctx, 1<<40); err != nil {
			return 0, 0, err
		}
		prog.step()
	}
	if err := appendMB(cfg.openWALMB); err != nil {
		return 0, 0, err
	}
	parts = len(sh.Manifest().Parts)
	if err := sh.Retire(ctx); err != nil {
		return 0, 0, err
	}
	if err := e.Close(); err != nil {
		return 0, 0, err
	}
	prog.step()
	return appended, parts, nil
}

// waitSealed waits until sh has nothing unsealed: the seal of the backlog that
// OpenShard armed is done, and a replay reads parts only, as the baseline does.
func waitSealed(ctx context.Context, sh *shard.Shard, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for sh.Info().UnsealedBytes > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the inherited backlog was not sealed within %s", limit)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// replayShard times l0's replay: Shard.Read of every record from offset 0.
func replayShard(ctx context.Context, sh *shard.Shard) (replay, error) {
	var out replay
	start := time.Now()
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			return replay{}, err
		}
		out.records++
		out.bytes += int64(len(rec.Value))
	}
	out.took = time.Since(start)
	return out, nil
}

// replayParts times the baseline replay: the same work without l0 around it, each
// part object got whole from bucket and every record decoded, its checksums
// checked, by the part reader.
func replayParts(ctx context.Context, bucket *substrate.Bucket, parts []manifest.Part) (replay, error) {
	var out replay
	start := time.Now()
	for _, p := range parts {
		data, _, err := bucket.Get(ctx, p.Key)
		if err != nil {
			return replay{}, err
		}
		r, err := part.Open(bytes.NewReader(data), int64(len(data)), p.Key, nil)
		if err != nil {
			return replay{}, err
		}
		for rec, err := range r.Records(p.First) {
			if err != nil {
				return replay{}, err
			}
			out.records++
			out.bytes += int64(len(rec.Value))
		}
	}
	out.took = time.Since(start)
	return out, nil
}
