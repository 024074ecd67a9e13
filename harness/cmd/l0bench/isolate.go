package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
)

// scenarioProcessEnv marks a process that l0bench started to run one scenario of a
// suite.
const scenarioProcessEnv = "L0BENCH_SCENARIO_PROCESS"

// inScenarioProcess reports whether this process runs one scenario for a parent.
func inScenarioProcess() bool { return os.Getenv(scenarioProcessEnv) != "" }

// runIsolated runs each scenario in a process of its own — this binary again, with
// the flags this one was given — so that each scenario's peak RSS, and the idle
// engine's RSS, are its own and not what earlier scenarios left in the heap and in
// pebble's manually allocated memtables. A -cpuprofile becomes one profile per
// scenario, FILE.SCENARIO.
func runIsolated(ctx context.Context, scenarios []string, stdout, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var args []string
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "scenario" && f.Name != "cpuprofile" {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	profile := ""
	if f := flag.Lookup("cpuprofile"); f != nil {
		profile = f.Value.String()
	}
	for _, sc := range scenarios {
		a := append(slices.Clone(args), "-scenario="+sc)
		if profile != "" {
			a = append(a, "-cpuprofile="+profile+"."+sc)
		}
		cmd := exec.CommandContext(ctx, self, a...)
		cmd.Env = append(os.Environ(), scenarioProcessEnv+"=1")
		cmd.Stdout, cmd.Stderr = stdout, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("scenario %s: %w", sc, err)
		}
	}
	return nil
}
