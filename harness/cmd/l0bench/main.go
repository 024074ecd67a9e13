// Command l0bench measures l0 beside its baselines, in one run, on the machine it
// runs on.
//
// With no arguments it runs the default suite in a temporary directory, each
// scenario in a process of its own (so the peak RSS a line reports is that
// scenario's). Contenders run in rounds, once each per round, in an order rotated
// each round; a figure is the median of its rounds with their min and max, and a
// ratio is the median of the per-round ratios. A quantile is reported only from
// enough samples (p99 from 1,000, p99.9 from 10,000), and a target that is a bound
// is judged on its worst round. It prints a table per scenario on stdout and
// appends one JSON line per scenario and configuration to -results. With -markdown
// FILE it also writes each scenario's output, as Markdown, between that scenario's
// markers in FILE, and leaves every other byte of FILE as it was: the repository's
// BENCHMARKS.md is written so.
//
// Scenarios:
//
//	append          1 KiB records, 16 per append, from -appenders goroutines, closed
//	                loop: the best raw writer (the limit: a shared buffer filled
//	                while the previous write + fdatasync runs, on a preallocated
//	                reused file), the old serial raw writer, pebble's wal with
//	                recycled files, pebble DB synced with one key per append (and,
//	                with -pebble-16-keys, 16), and l0 on each -shards count with its default
//	                seal triggers. Each run warms up (l0 until it has sealed) and
//	                measures a -window; l0's sealed bytes over appended bytes and
//	                its backlog are reported. A contender faster than the best raw
//	                writer marks the run invalid.
//	latency         l0's steady-state saturation on 64 shards, then 90% down to
//	                10% of it offered open-loop by one generator to l0 and to the
//	                best raw writer: quantiles per level and their per-round
//	                ratios, drawn in an SVG next to the results file.
//	seal            -seal-mb of JSON events sealed into one part on a local
//	                directory, beside zstd compressing the same bytes in the same
//	                blocks at the same level on one core.
//	inherited-seal  a backlog of -inherited-mb below every trigger (age 1 h) left by
//	                Retire; a new engine opens the shard: the time until it is
//	                sealed on the remote, beside a direct seal of the same backlog.
//	backfill        -backfill-parts parts on a local replica, a fresh remote
//	                attached: BackfillUnderReplicated + FlushAndWaitUploads, beside
//	                a raw copy doing the same work (get, check size and CRC, put if
//	                absent, then the manifest) with as many writers.
//	lag             8 shards at 8 MB/s, sealing every 512 KiB, copied to the
//	                remote: part committed on the local replica → on every replica,
//	                beside a raw put of a real part's bytes for each part that
//	                became durable, under the same load; in -rounds slices of time.
//	mixed           8 shards at 8 MB/s open-loop, alone and with a tailing reader
//	                per shard, seals every 1 MiB and copies to the remote, in rounds:
//	                append quantiles mixed over alone.
//	idle            -idle-shards shards, each holding a sealed part, idle for
//	                -idle-for: requests reaching the object store (counted at a
//	                proxy in front of it) and RSS at the end of the window.
//	open            (not in the default suite) a shard of -open-parts-mb in 64 MB
//	                parts plus -open-wal-mb in the WAL: engine and shard open times,
//	                the wait for the inherited seal, then the replay of every record
//	                beside getting and decoding every part with the part reader.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/seal"
)

// commit is set by the Makefile (-ldflags -X main.commit=...).
var commit = ""

type config struct {
	scenarios     []string
	sealMB        float64
	inheritedMB   float64
	backfillParts int
	backfillMB    float64
	idleShards    int
	idleFor       time.Duration
	openPartsMB   float64
	openWALMB     float64
	dir           string
	results       string
	rounds        int
	longRounds    int    // of the long scenarios: append, latency, mixed
	timing        timing // of the closed-loop append runs
	latencyWindow time.Duration
	mixedFor      time.Duration
	lagFor        time.Duration
	quick         bool
	extras        bool         // append: pebble DB with 16 keys per append too
	only          string       // append: only the contenders whose name holds it, and the best raw writer
	l0Seal        seal.Options // l0's seal triggers in append and latency; zero: the defaults
	shards        []int
	appenders     int
	recordSize    int
	batch         int
	markdown      string // -markdown: the file whose scenario sections the run replaces
	markdownPart  string // in a scenario process of a suite: where its sections go
	flags         string // the flags the run was given, for the Markdown's stamp
}

func main() {
	var cfg config
	var scenarios, shards string
	flag.StringVar(&scenarios, "scenario", "append,latency,seal,inherited-seal,backfill,lag,mixed,idle,tail,follow,reader,rebalance,churn,failover", "comma-separated scenarios to run: append, latency, seal, inherited-seal, backfill, lag, mixed, idle, tail, follow, reader, rebalance, churn, failover; and open (not in the default suite)")
	flag.Float64Var(&cfg.sealMB, "seal-mb", 16, "seal: MB of records per seal")
	flag.Float64Var(&cfg.inheritedMB, "inherited-mb", 2.5, "inherited-seal: MB of backlog")
	flag.IntVar(&cfg.backfillParts, "backfill-parts", 32, "backfill: parts of history")
	flag.Float64Var(&cfg.backfillMB, "backfill-mb", 8, "backfill: MB of records per part")
	flag.IntVar(&cfg.idleShards, "idle-shards", 1000, "idle: shards open")
	flag.Float64Var(&cfg.openPartsMB, "open-parts-mb", 1024, "open: MB of records sealed into parts")
	flag.Float64Var(&cfg.openWALMB, "open-wal-mb", 64, "open: MB of records left in the WAL")
	flag.DurationVar(&cfg.idleFor, "idle-for", 20*time.Second, "idle: how long the engine idles (ten renewal intervals at the default)")
	flag.StringVar(&cfg.dir, "dir", "", "directory for the runs' data (default: a new temporary directory, removed at the end)")
	flag.StringVar(&cfg.results, "results", "l0bench-results.jsonl", "file the JSON lines are appended to")
	flag.IntVar(&cfg.rounds, "rounds", 5, "rounds: each contender runs once per round, in an order rotated each round")
	flag.IntVar(&cfg.longRounds, "long-rounds", 3, "rounds of the long scenarios (append, latency, mixed)")
	flag.Int64Var(&cfg.timing.warmupBytes, "warmup-bytes", appendTiming.warmupBytes, "append and latency: bytes l0 and pebble must have acknowledged before a window opens")
	flag.DurationVar(&cfg.timing.warmup, "warmup", appendTiming.warmup, "append: warm-up before each measurement window (l0 warms up until it has sealed too)")
	flag.DurationVar(&cfg.timing.window, "window", appendTiming.window, "append: measurement window of each run")
	flag.DurationVar(&cfg.latencyWindow, "latency-window", 2*time.Second, "latency: measurement window of each load level")
	flag.DurationVar(&cfg.mixedFor, "mixed-for", 4*time.Second, "mixed: measured time of each run, after a settling second")
	flag.DurationVar(&cfg.lagFor, "lag-for", 15*time.Second, "lag: time under load, split into -rounds slices")
	flag.StringVar(&cfg.only, "contenders", "", "append: run only the contenders whose name contains this, and the best raw writer, e.g. \"off the WAL\" to profile one")
	flag.BoolVar(&cfg.extras, "pebble-16-keys", false, "append: add pebble DB with one key per record (16 per append), as l0bench once measured it")
	flag.BoolVar(&cfg.quick, "quick", false, "short windows and small data, for a smoke test: the figures mean little")
	flag.StringVar(&shards, "shards", "1,8,64", "append: shard counts")
	flag.IntVar(&cfg.appenders, "appenders", 64, "append: concurrent appenders")
	flag.IntVar(&cfg.recordSize, "record-size", 1024, "append: record size in bytes")
	flag.IntVar(&cfg.batch, "batch", 16, "append: records per append")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file (with several scenarios, one per scenario: FILE.SCENARIO)")
	flag.StringVar(&remoteKind, "remote", "gcs", "the remote replica of inherited-seal, backfill, lag and idle: gcs (in-process fake-gcs-server, or STORAGE_EMULATOR_HOST) or s3 (AWS_ENDPOINT_URL, or versitygw as a process)")
	durabilityFlag := flag.String("durability", "local", "the engines' durability mode outside the tail scenario: local (acknowledged on the local fsync) or remote (on the tail put too)")
	metricsAddr := flag.String("metrics-addr", "", "serve the engines' and buckets' Prometheus metrics at http://ADDR/metrics while running, e.g. 127.0.0.1:9464")
	flag.StringVar(&cfg.markdown, "markdown", "", "also render each scenario's output as Markdown into FILE, between the lines <!-- l0bench:begin SCENARIO --> and <!-- l0bench:end SCENARIO --> (a scenario without them is added under ## Results; one not run keeps its section)")
	flag.Parse()
	cfg.markdownPart = os.Getenv(markdownPartEnv)
	cfg.flags = flagsGiven()
	cfg.scenarios = strings.Split(scenarios, ",")
	var err error
	if cfg.shards, err = parseInts(shards); err != nil {
		fatalf("-shards: %v", err)
	}
	switch *durabilityFlag {
	case "local":
		durability = engine.Local
	case "remote":
		durability = engine.Remote
	default:
		fatalf("-durability: %q is neither local nor remote", *durabilityFlag)
	}
	if remoteKind != "gcs" && remoteKind != "s3" {
		fatalf("-remote: %q is neither gcs nor s3", remoteKind)
	}
	cfg.timing.maxWarmup = appendTiming.maxWarmup
	if cfg.quick {
		cfg.quicken()
	}
	if cfg.rounds < 1 || cfg.longRounds < 1 || cfg.appenders < 1 || cfg.recordSize < 1 || cfg.batch < 1 || cfg.timing.window <= 0 || cfg.latencyWindow <= 0 {
		fatalf("-rounds, -long-rounds, -appenders, -record-size, -batch, -window and -latency-window must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(cfg.scenarios) > 1 && !inScenarioProcess() {
		fmt.Printf("l0bench %s · %s · %d cores · each scenario in a process of its own\n\n", commitID(), runtime.Version(), runtime.NumCPU())
		if err := runIsolated(ctx, cfg.scenarios, cfg.markdown, os.Stdout, os.Stderr); err != nil {
			fatalf("%v", err)
		}
		fmt.Printf("results appended to %s\n", cfg.results)
		if cfg.markdown != "" {
			fmt.Printf("Markdown written into %s\n", cfg.markdown)
		}
		return
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fatalf("-cpuprofile: %v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatalf("-cpuprofile: %v", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *metricsAddr != "" {
		stopMetrics, err := serveMetrics(*metricsAddr)
		if err != nil {
			fatalf("-metrics-addr: %v", err)
		}
		defer stopMetrics()
	}
	if err := run(ctx, cfg, os.Stdout); err != nil {
		pprof.StopCPUProfile()
		fatalf("%v", err)
	}
}

// quicken makes every scenario short and small, for smoke tests.
func (c *config) quicken() {
	c.rounds, c.longRounds = min(c.rounds, 2), min(c.longRounds, 2)
	c.timing = timing{warmup: 100 * time.Millisecond, maxWarmup: time.Second, window: 300 * time.Millisecond}
	c.latencyWindow = 200 * time.Millisecond
	c.mixedFor, c.lagFor = 500*time.Millisecond, time.Second
	c.sealMB, c.inheritedMB, c.backfillParts, c.backfillMB = 1, 0.5, 4, 0.25
	c.idleShards, c.idleFor = 20, 2*time.Second
	c.openPartsMB, c.openWALMB = 8, 4
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "l0bench: "+format+"\n", args...)
	os.Exit(1)
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	root := cfg.dir
	if root == "" {
		tmp, err := os.MkdirTemp("", "l0bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		root = tmp
	}
	results, err := os.OpenFile(cfg.results, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer results.Close()
	watchDisk(root)
	if !inScenarioProcess() {
		fmt.Fprintf(out, "l0bench %s · %s · %d cores · data in %s\n\n", commitID(), runtime.Version(), runtime.NumCPU(), root)
	}
	// Under -markdown each scenario writes to a markdownWriter of its own, which
	// keeps its section; those of the scenarios that finished are written even when
	// a later one fails, each stamped with its own run.
	var sections []section
	for _, sc := range cfg.scenarios {
		w, md, start := out, (*markdownWriter)(nil), time.Now()
		if cfg.markdown != "" || cfg.markdownPart != "" {
			md = newMarkdownWriter(out)
			w = md
		}
		if err := runScenario(ctx, cfg, sc, root, w, results); err != nil {
			return errors.Join(err, cfg.writeMarkdown(sections))
		}
		if md != nil {
			sections = append(sections, section{name: sc, body: runStamp(cfg, start) + "\n\n" + md.String()})
		}
	}
	if err := cfg.writeMarkdown(sections); err != nil {
		return err
	}
	if !inScenarioProcess() {
		fmt.Fprintf(out, "results appended to %s\n", cfg.results)
		if cfg.markdown != "" {
			fmt.Fprintf(out, "Markdown written into %s\n", cfg.markdown)
		}
	}
	return nil
}

// runScenario runs the scenario sc, printing to out.
func runScenario(ctx context.Context, cfg config, sc, root string, out, results io.Writer) error {
	switch sc {
	case "append":
		return appendScenario(ctx, cfg, root, out, results)
	case "seal":
		return sealScenario(ctx, cfg, root, out, results)
	case "inherited-seal":
		return inheritedScenario(ctx, cfg, root, out, results)
	case "backfill":
		return backfillScenario(ctx, cfg, root, out, results)
	case "lag":
		return lagScenario(ctx, cfg, root, out, results)
	case "idle":
		return idleScenario(ctx, cfg, root, out, results)
	case "open":
		return openScenario(ctx, cfg, root, out, results)
	case "mixed":
		return mixedScenario(ctx, cfg, root, out, results)
	case "latency":
		return latencyScenario(ctx, cfg, root, out, results)
	case "tail":
		return tailScenario(ctx, cfg, root, out, results)
	case "rebalance":
		return rebalanceScenario(ctx, cfg, root, out, results)
	case "churn":
		return churnScenario(ctx, cfg, root, out, results)
	case "follow":
		return followScenario(ctx, cfg, root, out, results)
	case "reader":
		return readerScenario(ctx, cfg, root, out, results)
	case "failover":
		return failoverScenario(ctx, cfg, root, out, results)
	default:
		return fmt.Errorf("unknown scenario %q", sc)
	}
}

// emit appends l to the results file, stamped with the time and the environment.
func emit(results io.Writer, l resultLine) error {
	l.Time, l.Env, l.Valid = time.Now().UTC().Format(time.RFC3339), envInfo(), l.Invalid == ""
	return json.NewEncoder(results).Encode(l)
}

// resultLine is one line of the results file: one scenario run in one configuration.
type resultLine struct {
	Time      string            `json:"time"`
	Scenario  string            `json:"scenario"`
	Params    map[string]any    `json:"params"`
	Figures   any               `json:"figures"`
	Baselines any               `json:"baselines"`
	Ratios    map[string]paired `json:"ratios"`
	// Targets are judged on their worst round where the target is a bound.
	Targets []target `json:"targets,omitempty"`
	// Valid is false when the run contradicts its own baselines (a contender
	// faster than the limit), and Invalid says how.
	Valid   bool   `json:"valid"`
	Invalid string `json:"invalid,omitempty"`
	Env     env    `json:"env"`
}

type env struct {
	Cores        int    `json:"cores"`
	Go           string `json:"go"`
	Commit       string `json:"commit"`
	Host         string `json:"host"`
	PID          int    `json:"pid"` // each scenario of a suite runs in a process of its own
	PeakRSSBytes int64  `json:"peak_rss_bytes"`
	GoHeapSys    uint64 `json:"go_heap_sys_bytes"`
}

// envInfo is what a result line says about where it was measured.
func envInfo() env {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	host, _ := os.Hostname()
	return env{
		Cores:        runtime.NumCPU(),
		Go:           runtime.Version(),
		Commit:       commitID(),
		Host:         host,
		PID:          os.Getpid(),
		PeakRSSBytes: ru.Maxrss * 1024, // Linux reports KiB
		GoHeapSys:    ms.HeapSys,
	}
}

func commitID() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return "unknown"
}

// progress draws a one-line progress bar on stderr, redrawn at each step, once a
// scenario has run for a few seconds.
type progress struct {
	name  string
	total int
	n     int
	start time.Time
	shown bool
}

func newProgress(name string, total int) *progress {
	return &progress{name: name, total: total, start: time.Now()}
}

func (p *progress) step() {
	p.n++
	if time.Since(p.start) < 3*time.Second {
		return
	}
	const width = 30
	filled := min(width, width*p.n/max(1, p.total)) // a scenario may take a step more than it said
	fmt.Fprintf(os.Stderr, "\r%-8s [%s%s] %d/%d runs, %s", p.name, strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		p.n, p.total, time.Since(p.start).Round(time.Second))
	p.shown = true
}

func (p *progress) done() {
	if p.shown {
		fmt.Fprintln(os.Stderr)
	}
}

// metricsRegistry holds the metrics served by -metrics-addr; nil without the flag.
var metricsRegistry *prometheus.Registry

// serveMetrics starts serving metricsRegistry at addr.
func serveMetrics(addr string) (stop func(), err error) {
	metricsRegistry = prometheus.NewRegistry()
	metricsRegistry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metricsRegistry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	fmt.Fprintf(os.Stderr, "l0bench: metrics at http://%s/metrics\n", l.Addr())
	return func() { srv.Close() }, nil
}

// durability is the engines' durability mode, but in the tail scenario.
var durability = engine.Local

// engineRegisterer is the Registerer of an engine of the run, labelled so that two
// engines open at once do not collide; nil without -metrics-addr.
func engineRegisterer(engine string) prometheus.Registerer {
	if metricsRegistry == nil {
		return nil
	}
	return prometheus.WrapRegistererWith(prometheus.Labels{"engine": engine}, metricsRegistry)
}

// bucketRegisterer is the Registerer of the run's buckets; nil without
// -metrics-addr.
func bucketRegisterer() prometheus.Registerer {
	if metricsRegistry == nil {
		return nil
	}
	return metricsRegistry
}
