package sim

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"
)

var (
	seedFlag  = flag.Uint64("sim.seed", 0, "replay this one seed")
	seedsFlag = flag.Int("sim.seeds", 0, "seeds to run after the fixed ones (0: a few)")
	timeFlag  = flag.Duration("sim.time", 0, "run fresh seeds for this long instead")
	stepsFlag = flag.Int("sim.steps", 0, "steps per run (0: the default)")
)

// fixedSeeds run in every make test; each has caught, or covers, something.
var fixedSeeds = []uint64{1, 2, 3, 4, 5, 6}

// TestSimulationHoldsTheInvariants runs the fixed seeds, then fresh random ones
// (printed, so that a failure replays), or the seed given with -sim.seed.
func TestSimulationHoldsTheInvariants(t *testing.T) {
	if *seedFlag != 0 {
		run(t, *seedFlag)
		return
	}
	for _, s := range fixedSeeds {
		run(t, s)
	}
	fresh := *seedsFlag
	if fresh == 0 && *timeFlag == 0 {
		fresh = 2
	}
	deadline := time.Now().Add(*timeFlag)
	for i := 0; i < fresh || time.Now().Before(deadline); i++ {
		run(t, rand.Uint64()%1_000_000_000+1000)
	}
}

func run(t *testing.T, seed uint64) {
	t.Helper()
	start := time.Now()
	r := Run(Config{Seed: seed, Steps: *stepsFlag})
	t.Logf("seed %d: %d steps, %d operations, faults %v, %.1fs", seed, r.Steps, r.Ops, r.Faults, time.Since(start).Seconds())
	if r.Failed() {
		t.Fatal(r.Report())
	}
	if testing.Verbose() && *seedFlag != 0 {
		t.Log(r.Report())
	}
}
