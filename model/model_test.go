// Package model checks l0.qnt, the Quint model of l0's ownership protocol
// (DESIGN.md, "The protocol model"), and chain.qnt, the model of the reincarnation
// protocol by one chain write per instance, by random simulation: `quint run`
// plays random traces of a model and checks an invariant at every state.
//
// The tests install Quint with scripts/quint.sh (from the npm registry, once per
// version) and run it with a short budget and a fixed seed, printed, so that a
// failure is reproducible. For a longer run:
//
//	go test ./model/ -run Invariants -v -args -samples 20000 -steps 60 -seed 7
//
// or set QUINT_SAMPLES, QUINT_STEPS and QUINT_SEED.
package model

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	samples = flag.Int("samples", envInt("QUINT_SAMPLES", 200),
		"traces `quint run` plays for each invariant (env QUINT_SAMPLES)")
	steps = flag.Int("steps", envInt("QUINT_STEPS", 50),
		"steps of each trace (env QUINT_STEPS)")
	seed = flag.Uint64("seed", uint64(envInt("QUINT_SEED", 1)),
		"seed of the first run of each test; see runSeed (env QUINT_SEED)")
)

// runSeed is the seed of a test's n-th run. Quint's random numbers come from a
// counter that starts at the seed, so runs whose seeds are close play the same
// traces a few draws apart; these are 2^40 draws apart.
func runSeed(n int) uint64 { return *seed + uint64(n)<<40 }

// invariants are the model's invariants, each checked by a run of its own.
var invariants = []string{
	"AckedIsReadable",
	"NoOffsetAckedTwice",
	"NothingAckedPastAFence",
	"CollectionSparesNeeded",
	"ReadIsWholeOrFails",
}

// TestTheProtocolModelHoldsItsInvariants runs the protocol (module l0) for each
// invariant and fails, with quint's trace, if a run finds a violation.
func TestTheProtocolModelHoldsItsInvariants(t *testing.T) {
	holdsInvariants(t, "l0.qnt", "l0", invariants)
}

// holdsInvariants runs module of file for each invariant, in a run of its own,
// and fails, with quint's trace, if a run finds a violation.
func holdsInvariants(t *testing.T, file, module string, invs []string) {
	t.Parallel()
	quint := installQuint(t)
	for i, inv := range invs {
		t.Run(inv, func(t *testing.T) {
			t.Parallel()
			r := simulate(t, quint, file, module, inv, runSeed(i), *samples, *steps)
			if r.violated {
				t.Fatalf("%s is violated (seed %d, %d traces of %d steps); quint says:\n%s",
					inv, r.seed, *samples, *steps, r.output)
			}
			t.Logf("%s holds: %d traces of %d steps, seed %d, %.1fs", inv, *samples, *steps, r.seed, r.took.Seconds())
		})
	}
}

// brokenVariants are the modules of l0.qnt that each put one bug into the
// protocol, and the invariant the bug breaks. A model whose invariants no bug
// can break checks nothing, so each must be caught. A run stops at the first
// violation; seed is one that finds it within a few hundred traces (most bugs
// show in the first few), and within bounds a run from the seed -seed gives.
var brokenVariants = []brokenVariant{
	{"broken_skip_fence", "AckedIsReadable", 1, 500},
	{"broken_ack_before_sync", "AckedIsReadable", 1000003, 4000},
	{"broken_ack_before_ship", "AckedIsReadable", 1, 500},
	{"broken_ack_before_point", "AckedIsReadable", 1, 500},
	{"broken_reuse_offset", "NoOffsetAckedTwice", 1, 500},
	{"broken_ack_on_existing", "NothingAckedPastAFence", 1, 500},
	{"broken_collect_needed", "CollectionSparesNeeded", 1, 500},
	{"broken_collect_last", "AckedIsReadable", 6000018, 3000},
	{"broken_collect_in_doubt", "CollectionSparesNeeded", 99, 6000},
	{"broken_read_at_from", "ReadIsWholeOrFails", 1000003, 4000},
}

// TestTheModelCatchesEachBrokenVariant runs each broken variant and requires a
// violation of the invariant it names: from its own seed, or with -seed (or
// QUINT_SEED) given, from runSeed.
func TestTheModelCatchesEachBrokenVariant(t *testing.T) {
	catchesEachBrokenVariant(t, "l0.qnt", brokenVariants)
}

// brokenVariant is a module that puts one bug into a model, the invariant the
// bug breaks, a seed that finds it, and within how many traces.
type brokenVariant struct {
	module, breaks string
	seed           uint64
	within         int
}

// catchesEachBrokenVariant runs each variant of file and requires a violation of
// the invariant it names.
func catchesEachBrokenVariant(t *testing.T, file string, variants []brokenVariant) {
	t.Parallel()
	quint := installQuint(t)
	for i, v := range variants {
		t.Run(v.module, func(t *testing.T) {
			t.Parallel()
			s := v.seed
			if seedGiven() {
				s = runSeed(i)
			}
			r := simulate(t, quint, file, v.module, v.breaks, s, v.within, *steps)
			if !r.violated {
				t.Fatalf("%s: no violation of %s in %d traces of %d steps (seed %d): the model no longer catches this bug",
					v.module, v.breaks, v.within, *steps, r.seed)
			}
			t.Logf("%s breaks %s: seed %d, found in about %d traces, %.1fs; quint: %s",
				v.module, v.breaks, r.seed, r.traces, r.took.Seconds(), r.summary)
		})
	}
}

// chainInvariants are the invariants of chain.qnt, the model of the
// reincarnation protocol by one chain write per instance.
var chainInvariants = []string{
	"AckedIsReadable",
	"NoOffsetAckedTwice",
	"NothingAckedPastAFence",
	"AckedOnlyInTheChain",
	"ReincarnationIsOneWrite",
	"CollectionSparesNeeded",
}

// TestTheChainModelHoldsItsInvariants runs the reincarnation protocol (module
// chain of chain.qnt) for each invariant and fails, with quint's trace, if a run
// finds a violation.
func TestTheChainModelHoldsItsInvariants(t *testing.T) {
	holdsInvariants(t, "chain.qnt", "chain", chainInvariants)
}

// chainBrokenVariants are the modules of chain.qnt that each put one bug into
// the reincarnation protocol, and the invariant the bug breaks, as
// brokenVariants are for l0.qnt: seed finds it within a few hundred traces.
var chainBrokenVariants = []brokenVariant{
	{"broken_no_mark", "AckedIsReadable", 1, 500},
	{"broken_ack_before_chain", "AckedIsReadable", 10, 1000},
	{"broken_ignore_marks", "AckedIsReadable", 1, 500},
	{"broken_read_one_incarnation", "AckedIsReadable", 1, 1000},
	{"broken_restart_keeps_epoch", "AckedIsReadable", 4, 2500},
	{"broken_blind_retry", "ReincarnationIsOneWrite", 1, 500},
	{"broken_collect_dead_without_fence", "AckedIsReadable", 1, 1500},
	{"broken_skip_fence", "AckedIsReadable", 1, 500},
	{"broken_collect_needed", "CollectionSparesNeeded", 1, 500},
}

// TestTheChainModelCatchesEachBrokenVariant runs each broken variant of
// chain.qnt and requires a violation of the invariant it names.
func TestTheChainModelCatchesEachBrokenVariant(t *testing.T) {
	catchesEachBrokenVariant(t, "chain.qnt", chainBrokenVariants)
}

// seedGiven reports whether the seed came from -seed or QUINT_SEED.
func seedGiven() bool {
	_, given := os.LookupEnv("QUINT_SEED")
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "seed" })
	return given
}

// result is what one `quint run` found.
type result struct {
	violated bool
	seed     uint64
	took     time.Duration
	traces   int    // how many traces it played, as its rate says (about)
	output   string // quint's output: on a violation, the trace
	summary  string // its verdict line and the seed that replays the trace
}

// simulate runs `quint run` on module of file (in this directory), checking
// invariant, for up to samples traces of steps steps from seed.
func simulate(t *testing.T, quint, file, module, invariant string, seed uint64, samples, steps int) result {
	t.Helper()
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		defer cancel()
	}
	// The typescript backend runs in node; the default one downloads a Rust
	// evaluator at run time.
	cmd := exec.CommandContext(ctx, quint, "run", file,
		"--main", module, "--backend", "typescript",
		"--max-samples", strconv.Itoa(samples), "--max-steps", strconv.Itoa(steps),
		"--seed", strconv.FormatUint(seed, 10),
		"--invariants", invariant, "--verbosity", "2")
	// Quint's output goes to a file, not a pipe: node queues what a full pipe
	// does not take and exits without writing it, so that under load the verdict
	// at the end of a long trace was lost (and the run taken for a failure).
	out, err := os.CreateTemp(t.TempDir(), "quint-*.out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	output, rerr := os.ReadFile(out.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	r := result{seed: seed, took: took, output: string(output)}
	r.summary, r.traces = summarize(r.output)
	var exit *exec.ExitError
	switch {
	case err == nil && strings.Contains(r.output, "[ok] No violation found"):
	case errors.As(err, &exit) && exit.ExitCode() == 1 && strings.Contains(r.output, "[violation]"):
		r.violated = true
	default:
		t.Fatalf("quint run %s --main %s --invariants %s: %v; it says:\n%s", file, module, invariant, err, r.output)
	}
	return r
}

var (
	verdict = regexp.MustCompile(`\[(ok|violation)\][^\n]*|--seed=0x[0-9a-f]+`)
	rate    = regexp.MustCompile(`\((\d+)ms at (\d+) traces/second\)`)
)

// summarize picks out quint's verdict and the seed that replays its last trace,
// and works out from the rate it reports how many traces it played.
func summarize(output string) (summary string, traces int) {
	if m := rate.FindStringSubmatch(output); m != nil {
		ms, _ := strconv.Atoi(m[1])
		perSecond, _ := strconv.Atoi(m[2])
		traces = max(1, (ms*perSecond+500)/1000)
	}
	return strings.Join(verdict.FindAllString(output, -1), " "), traces
}

var (
	installOnce sync.Once
	quintPath   string
	installErr  error
)

// installQuint returns the path of the quint binary, installing it first if
// needed (scripts/quint.sh). A missing Quint fails the test: it is not skipped.
func installQuint(t *testing.T) string {
	t.Helper()
	installOnce.Do(func() {
		cmd := exec.Command("../scripts/quint.sh")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		quintPath = strings.TrimSpace(string(out))
		if err != nil {
			installErr = errors.New(err.Error() + ": " + stderr.String())
		} else if _, err := os.Stat(quintPath); err != nil {
			installErr = err
		}
	})
	if installErr != nil {
		t.Fatalf("installing Quint with scripts/quint.sh: %v", installErr)
	}
	return quintPath
}

// envInt is the integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}
