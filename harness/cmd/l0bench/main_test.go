package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// asMainEnv makes the test binary run l0bench's main instead of the tests: the suite
// test starts it so, and the scenario processes it starts inherit the variable.
const asMainEnv = "L0BENCH_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) != "" {
		main()
		os.Exit(0)
	}
	// fake-gcs-server pulls in opencensus, which starts a worker at init.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// quickConfig is a -quick configuration of scenarios writing to a temporary
// directory and results file.
func quickConfig(t *testing.T, scenarios ...string) config {
	cfg := config{scenarios: scenarios, dir: t.TempDir(), results: filepath.Join(t.TempDir(), "results.jsonl"), rounds: 2, longRounds: 2,
		shards: []int{1, 2}, appenders: 4, recordSize: 1024, batch: 16}
	cfg.quicken()
	return cfg
}

// resultLines reads the results file of cfg.
func resultLines(t *testing.T, cfg config) []resultLine {
	t.Helper()
	data, err := os.ReadFile(cfg.results)
	if err != nil {
		t.Fatal(err)
	}
	var out []resultLine
	for line := range strings.Lines(string(data)) {
		var l resultLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// TestTheAppendScenarioPrintsEveryContenderAndWritesOneLinePerShardCount runs the
// scenario briefly: every contender appended, and each result line carries l0's
// figures, every baseline and the ratios to each.
func TestTheAppendScenarioPrintsEveryContenderAndWritesOneLinePerShardCountAndMode(t *testing.T) {
	cfg := quickConfig(t, "append")
	cfg.extras = true
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, k := range appendKinds(cfg.shards, cfg.l0Seal, true) {
		if !strings.Contains(out.String(), k.name) {
			t.Errorf("table lacks %q:\n%s", k.name, out.String())
		}
	}
	f, err := os.Open(cfg.results)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines int
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		var l struct {
			resultLine
			Figures   appendFigures            `json:"figures"`
			Baselines map[string]appendFigures `json:"baselines"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		if l.Scenario != "append" || l.Figures.MBps.Median <= 0 || l.Figures.AckP50Ms.Median <= 0 || len(l.Baselines) != 6 || l.Figures.SealedOverAppended == nil {
			t.Fatalf("line %d: %+v", lines, l)
		}
		for _, key := range []string{bestRaw, serialRaw, pebbleWAL, pebbleOneKey, pebble16Keys, l0WAL} {
			if r := l.Ratios["mb_per_s_vs_"+key]; r.Rounds != cfg.rounds || r.Median <= 0 {
				t.Fatalf("line %d: ratio to %s: %+v", lines, key, r)
			}
		}
		if l.Env.Cores == 0 || l.Env.PeakRSSBytes == 0 {
			t.Fatalf("line %d: env %+v", lines, l.Env)
		}
		// Appending costs CPU: a contender reported at none was not measured.
		for key, fig := range l.Baselines {
			if fig.CPUMsPerMB.Median <= 0 || fig.CoresBusy.Median <= 0 {
				t.Fatalf("line %d: %s's CPU: %+v, %+v", lines, key, fig.CPUMsPerMB, fig.CoresBusy)
			}
		}
		if l.Figures.CPUMsPerMB.Median <= 0 || l.Figures.CoresBusy.Median <= 0 {
			t.Fatalf("line %d: l0's CPU: %+v, %+v", lines, l.Figures.CPUMsPerMB, l.Figures.CoresBusy)
		}
	}
	if !strings.Contains(out.String(), "CPU ms per MB appended") {
		t.Errorf("no note of the bound the cores put on l0:\n%s", out.String())
	}
	want := 3
	if haveMemoryStore() {
		want++
		if !strings.Contains(out.String(), "object store off the WAL's disk, MB/s over the best raw writer's") {
			t.Errorf("no target for l0 with its object store off the WAL's disk:\n%s", out.String())
		}
	}
	if lines != want {
		t.Fatalf("%d result lines, want %d: one per shard count, one for the other durability mode and one with the object store off the WAL's disk", lines, want)
	}
}

// TestTheSealScenariosReportTheirFiguresBesideTheirBaselines runs seal,
// inherited-seal, backfill, lag and mixed on small backlogs: each prints its
// contenders and targets, and writes a line with paired ratios.
func TestTheSealScenariosReportTheirFiguresBesideTheirBaselines(t *testing.T) {
	cfg := quickConfig(t, "seal", "inherited-seal", "backfill", "lag", "mixed")
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"zstd SpeedFastest", "OpenShard on a new engine", "target openshard_to_sealed_ms ≤ 500",
		"BackfillUnderReplicated + FlushAndWaitUploads", "get, check size and CRC", "part committed on the local replica → on every replica",
		"raw put of a real", "tail read MB/s", "target append p99 mixed over alone",
		"note: a seal took", "cores busy in the kernel"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	var scenarios []string
	for _, l := range resultLines(t, cfg) {
		if len(l.Ratios) == 0 || l.Baselines == nil || len(l.Targets) == 0 {
			t.Fatalf("%s: no baseline, ratio or target: %+v", l.Scenario, l)
		}
		scenarios = append(scenarios, l.Scenario)
	}
	if strings.Join(scenarios, ",") != "seal,inherited-seal,backfill,lag,mixed" {
		t.Fatalf("result lines for %v", scenarios)
	}
}

// TestMetricsAddrServesTheEnginesMetricsWhileRunning: with -metrics-addr the run's
// engines register their l0_ metrics on the served registry.
func TestMetricsAddrServesTheEnginesMetricsWhileRunning(t *testing.T) {
	stop, err := serveMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); metricsRegistry = nil }()
	cfg := quickConfig(t, "append")
	cfg.rounds, cfg.shards = 1, []int{1}
	reg := engineRegisterer("append")
	if reg == nil {
		t.Fatal("no registerer with -metrics-addr")
	}
	if err := run(t.Context(), cfg, io.Discard); err != nil {
		t.Fatal(err)
	}
	families, err := metricsRegistry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	for _, want := range []string{"l0_substrate_operations_total", "go_goroutines"} {
		if !slices.Contains(names, want) {
			t.Fatalf("%s not served; served: %v", want, names)
		}
	}
}

// TestTheLatencyScenarioDrawsItsLevels: every offered level is in the result line,
// for l0 and the best raw writer, and the SVG is well-formed XML with a line per
// quantile of each.
func TestTheLatencyScenarioDrawsItsLevels(t *testing.T) {
	cfg := quickConfig(t, "latency")
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(strings.TrimSuffix(cfg.results, ".jsonl") + "-latency.svg")
	if err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(svg))
	lines := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 5 {
		t.Fatalf("%d quantile lines, want 5", lines)
	}
	data, _ := os.ReadFile(cfg.results)
	contenders := 2 // l0 and the best raw writer
	if haveMemoryStore() {
		contenders++ // and l0 with its object store off the WAL's disk
		if !strings.Contains(out.String(), "target l0 with its object store off the WAL's disk p50 at half load over the best raw writer's ≤ 1.50") {
			t.Fatalf("no half-load target for l0 off the WAL's disk:\n%s", out.String())
		}
	}
	if strings.Count(string(data), `"fraction_of_saturation"`) != contenders*len(loadFractions) || !strings.Contains(string(data), `"`+bestRaw+`"`) {
		t.Fatalf("result line: %s", data)
	}
	if !strings.Contains(out.String(), "target l0 p99 at half load over the best raw writer's ≤ 1.50") {
		t.Fatalf("no half-load target:\n%s", out.String())
	}
}

// TestTheRemoteCanBeS3: -remote s3 runs the replica scenarios against versitygw.
func TestTheRemoteCanBeS3(t *testing.T) {
	remoteKind = "s3"
	defer func() { remoteKind = "gcs" }()
	var out bytes.Buffer
	cfg := quickConfig(t, "backfill")
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "remote replica (s3 http://127.0.0.1:") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// TestTheOpenScenarioReplaysEveryRecord runs open on a small shard.
func TestTheOpenScenarioReplaysEveryRecord(t *testing.T) {
	var out bytes.Buffer
	cfg := quickConfig(t, "open")
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"engine.Open (WAL recovery)", "replay of every record (12288 records", "get every part object"} {
		if !strings.Contains(out.String(), s) {
			t.Fatalf("output lacks %q:\n%s", s, out.String())
		}
	}
}

// TestTheProgressBarSurvivesMoreStepsThanItWasToldOf: a scenario's count of steps is
// an estimate; drawing past it must not panic.
func TestTheProgressBarSurvivesMoreStepsThanItWasToldOf(t *testing.T) {
	p := newProgress("test", 2)
	p.start = time.Now().Add(-time.Minute) // draw at once
	for range 5 {
		p.step()
	}
	p.done()
}

// TestASuiteRunsEachScenarioInAProcessOfItsOwn: two scenarios, one header, both
// tables, and two result lines from two processes other than this one.
func TestASuiteRunsEachScenarioInAProcessOfItsOwn(t *testing.T) {
	results := filepath.Join(t.TempDir(), "results.jsonl")
	cmd := exec.Command(os.Args[0], "-scenario=seal,inherited-seal", "-quick",
		"-results="+results, "-dir="+t.TempDir())
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, stderr.String())
	}
	if n := strings.Count(string(out), "l0bench "); n != 1 {
		t.Fatalf("%d headers:\n%s", n, out)
	}
	for _, want := range []string{"seal ·", "inherited-seal ·", "results appended to"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Scenario string `json:"scenario"`
			Env      struct {
				PID int `json:"pid"`
			} `json:"env"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Env.PID == 0 || r.Env.PID == os.Getpid() || r.Env.PID == cmd.Process.Pid {
			t.Fatalf("%s measured in process %d (test %d, suite %d)", r.Scenario, r.Env.PID, os.Getpid(), cmd.Process.Pid)
		}
		pids[r.Env.PID] = r.Scenario
	}
	if len(pids) != 2 {
		t.Fatalf("scenarios by process: %v", pids)
	}
}

// TestTheTailScenarioJudgesItsThreeTargets: the tail scenario prints its latency,
// puts, move and reincarnation figures beside their baselines, and judges the
// four targets.
func TestTheTailScenarioJudgesItsFourTargets(t *testing.T) {
	cfg := quickConfig(t, "tail")
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"append ack p50 ms", "put of a 250 KB object", "tail puts/s, 64 busy shards",
		"OpenShard → sealed ms, another machine", "target append ack p50 over flush interval/2",
		"target tail puts/s", "target cross-machine move", "a fence's object-store writes, 256 busy shards",
		"target writes a fence adds"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	lines := resultLines(t, cfg)
	if len(lines) != 1 || lines[0].Scenario != "tail" || len(lines[0].Targets) != 4 {
		t.Fatalf("results: %+v", lines)
	}
	if !strings.Contains(fmt.Sprint(lines[0].Figures), "tail_puts_per_s_1_shards") {
		t.Fatalf("figures: %+v", lines[0].Figures)
	}
}

// TestTheFleetScenariosJudgeTheirTargets: rebalance and churn print their figures
// and write one line each with their targets.
func TestTheFleetScenariosJudgeTheirTargets(t *testing.T) {
	cfg := quickConfig(t, "rebalance", "churn")
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"late joiner's share of the appends", "records replayed from a tail", "drain ms p50",
		"revocations · per change", "target rebalance"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	lines := resultLines(t, cfg)
	if len(lines) != 2 || lines[0].Scenario != "rebalance" || len(lines[0].Targets) != 3 || lines[1].Scenario != "churn" || len(lines[1].Targets) != 2 {
		t.Fatalf("results: %+v", lines)
	}
}
