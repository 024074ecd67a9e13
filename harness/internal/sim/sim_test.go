package sim

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l0store/l0/internal/broken"
)

var (
	seedFlag  = flag.Uint64("sim.seed", 0, "replay this one seed")
	seedsFlag = flag.Int("sim.seeds", 0, "seeds to run after the fixed ones (0: a few)")
	timeFlag  = flag.Duration("sim.time", 0, "run fresh seeds for this long instead")
	stepsFlag = flag.Int("sim.steps", 0, "steps per run (0: the default)")
	fleetFlag = flag.Bool("sim.fleet", false, "fleet mode only: replay -sim.seed in it, or run only its seeds, fixed and fresh")
)

// fixedSeeds run in every make test; each has caught, or covers, something.
var fixedSeeds = []uint64{1, 2, 3, 4, 5, 6}

// fleetSeeds run in fleet mode (Config.Fleet) in every make test; 1 and 3 catch
// a member that claims, and keeps, a fenced handle of a shard assigned to it
// (the stale claim), as a liveness violation after a blackout.
var fleetSeeds = []uint64{1, 3}

// TestSimulationHoldsTheInvariants runs the fixed seeds, those of fleet mode, then
// fresh random ones, every other one in fleet mode (printed, so that a failure
// replays), or the seed given with -sim.seed (and -sim.fleet).
func TestSimulationHoldsTheInvariants(t *testing.T) {
	var total tally
	defer func() {
		t.Logf("%d seeds, %d steps, %d operations in %s; faults %v", total.seeds, total.steps, total.ops, time.Since(total.start).Round(time.Second), total.faults)
	}()
	total.start, total.faults = time.Now(), map[string]int{}
	if *seedFlag != 0 {
		run(t, *seedFlag, *fleetFlag, &total)
		return
	}
	if !*fleetFlag {
		for _, s := range fixedSeeds {
			run(t, s, false, &total)
		}
	}
	for _, s := range fleetSeeds {
		run(t, s, true, &total)
	}
	fresh := *seedsFlag
	if fresh == 0 && *timeFlag == 0 {
		fresh = 2
	}
	deadline := time.Now().Add(*timeFlag)
	for i := 0; i < fresh || time.Now().Before(deadline); i++ {
		run(t, rand.Uint64()%1_000_000_000+1000, *fleetFlag || i%2 == 1, &total)
	}
}

// tally sums the runs of a test.
type tally struct {
	start             time.Time
	seeds, steps, ops int
	faults            map[string]int
}

func run(t *testing.T, seed uint64, fleet bool, total *tally) {
	t.Helper()
	start := time.Now()
	r := Run(Config{Seed: seed, Steps: *stepsFlag, Fleet: fleet})
	total.seeds, total.steps, total.ops = total.seeds+1, total.steps+r.Steps, total.ops+r.Ops
	for k, n := range r.Faults {
		total.faults[k] += n
	}
	mode := ""
	if fleet {
		mode = " (fleet)"
	}
	t.Logf("seed %d%s: %d steps, %d operations, faults %v, %.1fs", seed, mode, r.Steps, r.Ops, r.Faults, time.Since(start).Seconds())
	if r.Failed() {
		t.Fatal(r.Report())
	}
	if testing.Verbose() && *seedFlag != 0 {
		t.Log(r.Report())
	}
}

// TestTheSimulationCatchesEachBrokenGuard builds the engine with the l0broken
// tag and, for each of the guards the promises rest on, switches it off and runs
// the fixed seeds, then those of fleet mode: one of them must report a broken
// promise.
func TestTheSimulationCatchesEachBrokenGuard(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sim-broken.test")
	if out, err := exec.Command("go", "test", "-c", "-tags", "l0broken", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the broken engine: %v\n%s", err, out)
	}
	type seeded struct {
		seed  uint64
		fleet bool
	}
	var seeds []seeded
	for _, s := range fixedSeeds {
		seeds = append(seeds, seeded{s, false})
	}
	for _, s := range fleetSeeds {
		seeds = append(seeds, seeded{s, true})
	}
	for _, g := range broken.Guards {
		caught := false
		for _, s := range seeds {
			cmd := exec.Command(bin, "-test.run", "^TestSimulationHoldsTheInvariants$", "-test.count=1",
				fmt.Sprintf("-sim.seed=%d", s.seed), fmt.Sprintf("-sim.fleet=%v", s.fleet))
			cmd.Env = append(os.Environ(), "L0_BROKEN="+string(g))
			out, err := cmd.CombinedOutput()
			if err == nil {
				continue
			}
			_, violation, ok := strings.Cut(string(out), "VIOLATION: ")
			if !ok {
				t.Fatalf("%s, seed %d (fleet %v): the run failed without naming a broken promise:\n%s", g, s.seed, s.fleet, out)
			}
			line, _, _ := strings.Cut(violation, "\n")
			mode := ""
			if s.fleet {
				mode = " in fleet mode"
			}
			t.Logf("%s: caught by seed %d%s: %s", g, s.seed, mode, line)
			caught = true
			break
		}
		if !caught {
			t.Errorf("with %s switched off, every fixed seed passed", g)
		}
	}
}
