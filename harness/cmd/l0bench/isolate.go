package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// scenarioProcessEnv marks a process that l0bench started to run one scenario of a
// suite.
const scenarioProcessEnv = "L0BENCH_SCENARIO_PROCESS"

// markdownPartEnv names the file a scenario process of a suite run with -markdown
// writes its Markdown section to, for the suite to splice: the suite alone writes
// the Markdown file, once, whatever its scenarios do.
const markdownPartEnv = "L0BENCH_MARKDOWN_PART"

// inScenarioProcess reports whether this process runs one scenario for a parent.
func inScenarioProcess() bool { return os.Getenv(scenarioProcessEnv) != "" }

// runIsolated runs each scenario in a process of its own — this binary again, with
// the flags this one was given — so that each scenario's peak RSS, and the idle
// engine's RSS, are its own and not what earlier scenarios left in the heap and in
// pebble's manually allocated memtables. A -cpuprofile becomes one profile per
// scenario, FILE.SCENARIO. With a markdown file, each process writes its section to
// a part file and the sections of the scenarios that finished are spliced into the
// file at the end, even when a later one failed.
func runIsolated(ctx context.Context, scenarios []string, markdown string, stdout, stderr io.Writer) (err error) {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var args []string
	flag.Visit(func(f *flag.Flag) {
		if f.Name != "scenario" && f.Name != "cpuprofile" && f.Name != "markdown" {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	var parts string
	var sections []section
	if markdown != "" {
		if parts, err = os.MkdirTemp("", "l0bench-markdown-"); err != nil {
			return err
		}
		defer os.RemoveAll(parts)
		defer func() {
			if len(sections) > 0 {
				err = errors.Join(err, spliceFile(markdown, sections))
			}
		}()
	}
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
		part := ""
		if parts != "" {
			part = filepath.Join(parts, sc+".md")
			cmd.Env = append(cmd.Env, markdownPartEnv+"="+part)
		}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("scenario %s: %w", sc, err)
		}
		if part != "" {
			b, err := os.ReadFile(part)
			if err != nil {
				return fmt.Errorf("scenario %s: its Markdown: %w", sc, err)
			}
			s, err := parseSections(string(b))
			if err != nil {
				return fmt.Errorf("scenario %s: its Markdown: %w", sc, err)
			}
			sections = append(sections, s...)
		}
	}
	return nil
}

// flagsGiven lists the flags the run was given that change what it measures, for
// the Markdown's stamp: not those naming files, addresses or the scenarios, which
// the sections say themselves.
func flagsGiven() string {
	var given []string
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "scenario", "cpuprofile", "markdown", "results", "dir", "metrics-addr":
			return
		}
		v := f.Value.String()
		switch {
		case v == "true" && isBoolFlag(f):
			given = append(given, "-"+f.Name)
		case strings.ContainsAny(v, " \t\"") || v == "":
			given = append(given, "-"+f.Name+"="+strconv.Quote(v))
		default:
			given = append(given, "-"+f.Name+"="+v)
		}
	})
	if len(given) == 0 {
		return ""
	}
	return "flags " + strings.Join(given, " ")
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
