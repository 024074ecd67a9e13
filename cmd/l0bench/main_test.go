package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
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

// TestTheAppendScenarioPrintsEveryContenderAndWritesOneLinePerShardCount runs the
// scenario briefly: every contender appended, and each result line carries figures,
// the three baselines and their ratios.
func TestTheAppendScenarioPrintsEveryContenderAndWritesOneLinePerShardCount(t *testing.T) {
	results := filepath.Join(t.TempDir(), "results.jsonl")
	cfg := config{
		scenarios: []string{"append"}, dir: t.TempDir(), results: results, rounds: 1,
		duration: 50 * time.Millisecond, shards: []int{1, 2}, appenders: 4, recordSize: 1024, batch: 16,
	}
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"raw append+fdatasync", "raw group commit", "pebble synced commits", "l0"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("table lacks %q:\n%s", name, out.String())
		}
	}
	f, err := os.Open(results)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines int
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		var l struct {
			resultLine
			Figures   figures            `json:"figures"`
			Baselines map[string]figures `json:"baselines"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		if l.Scenario != "append" || l.Figures.MBps <= 0 || l.Figures.P99Ms <= 0 || len(l.Baselines) != 3 {
			t.Fatalf("line %d: %+v", lines, l)
		}
		for k, v := range l.Ratios {
			if v <= 0 {
				t.Fatalf("line %d: ratio %s = %v", lines, k, v)
			}
		}
		if l.Env.Cores == 0 || l.Env.PeakRSSBytes == 0 {
			t.Fatalf("line %d: env %+v", lines, l.Env)
		}
	}
	if lines != 2 {
		t.Fatalf("%d result lines, want one per shard count", lines)
	}
}

// TestTheSealScenariosReportTheirFiguresBesideTheirBaselines runs seal,
// inherited-seal, backfill, lag, mixed and idle on small backlogs.
func TestTheSealScenariosReportTheirFiguresBesideTheirBaselines(t *testing.T) {
	results := filepath.Join(t.TempDir(), "results.jsonl")
	cfg := config{scenarios: []string{"seal", "inherited-seal", "backfill", "lag", "mixed", "idle"}, dir: t.TempDir(), results: results, rounds: 1,
		sealMB: 0.5, inheritedMB: 0.2, backfillParts: 2, backfillMB: 0.1, duration: 50 * time.Millisecond,
		idleShards: 3, idleFor: 100 * time.Millisecond}
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"zstd SpeedFastest", "OpenShard on a new engine", "target: sealed within 500ms",
		"BackfillUnderReplicated + FlushAndWaitUploads", "seal → durable on every replica", "tail read MB/s", "conditional writes per shard"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	data, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var scenarios []string
	for line := range strings.Lines(string(data)) {
		var l resultLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if len(l.Ratios) == 0 || l.Baselines == nil {
			t.Fatalf("%s: no baseline or ratio: %s", l.Scenario, line)
		}
		for k, v := range l.Ratios {
			// An idle run shorter than a renewal interval rightly sees no write.
			if v <= 0 && l.Scenario != "idle" {
				t.Fatalf("%s: ratio %s = %v", l.Scenario, k, v)
			}
		}
		scenarios = append(scenarios, l.Scenario)
	}
	if strings.Join(scenarios, ",") != "seal,inherited-seal,backfill,lag,mixed,idle" {
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
	cfg := config{scenarios: []string{"append"}, dir: t.TempDir(), results: filepath.Join(t.TempDir(), "r.jsonl"), rounds: 1,
		duration: 50 * time.Millisecond, shards: []int{1}, appenders: 2, recordSize: 1024, batch: 16}
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

// TestTheLatencyScenarioDrawsItsLevels: every offered level is in the result line and
// the SVG is well-formed XML with a line per percentile.
func TestTheLatencyScenarioDrawsItsLevels(t *testing.T) {
	results := filepath.Join(t.TempDir(), "r.jsonl")
	cfg := config{scenarios: []string{"latency"}, dir: t.TempDir(), results: results, rounds: 1,
		duration: 100 * time.Millisecond, appenders: 4, recordSize: 1024, batch: 16}
	if err := run(t.Context(), cfg, io.Discard); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(strings.TrimSuffix(results, ".jsonl") + "-latency.svg")
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
	if lines != 3 {
		t.Fatalf("%d percentile lines, want 3", lines)
	}
	data, _ := os.ReadFile(results)
	if !strings.Contains(string(data), `"levels"`) || strings.Count(string(data), `"fraction_of_saturation"`) != len(loadFractions) ||
		strings.Count(string(data), `"generator_late_p99_ms"`) != len(loadFractions) {
		t.Fatalf("result line: %s", data)
	}
}

// TestTheRemoteCanBeS3: -remote s3 runs the replica scenarios against versitygw.
func TestTheRemoteCanBeS3(t *testing.T) {
	remoteKind = "s3"
	defer func() { remoteKind = "gcs" }()
	var out bytes.Buffer
	cfg := config{scenarios: []string{"backfill"}, dir: t.TempDir(), results: filepath.Join(t.TempDir(), "r.jsonl"), rounds: 1,
		backfillParts: 2, backfillMB: 0.1}
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
	cfg := config{scenarios: []string{"open"}, dir: t.TempDir(), results: filepath.Join(t.TempDir(), "r.jsonl"), rounds: 1,
		openPartsMB: 8, openWALMB: 4}
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
	cmd := exec.Command(os.Args[0], "-scenario=seal,inherited-seal", "-rounds=1", "-seal-mb=0.5", "-inherited-mb=0.25",
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
