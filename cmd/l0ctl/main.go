// Command l0ctl inspects, verifies and repairs a store that l0 engines write: its
// shards' manifests and parts on every replica, the tails their manifests point
// at, the instance leases, and the fleets.
//
//	l0ctl COMMAND -replica NAME=URL [-replica NAME=URL ...] [flags] [args]
//
// Run l0ctl -h for the commands, and l0ctl COMMAND -h for one. The exit status is
// 0 on success (for verify: a healthy store), 1 on a failure (for verify: any
// damage found), 2 on a usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"text/tabwriter"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// command is one subcommand.
type command struct {
	name, args, summary string
	// help is the rest of the command's help, after its usage line and summary.
	help string
	// flags adds the command's own flags; run does the work with the store open.
	flags func(fs *flag.FlagSet) any
	run   func(c *call) error
	// min and max bound the number of positional arguments (max -1: any).
	min, max int
}

// call is one run of a command: its parsed flags and arguments, the store, and
// where its output goes.
type call struct {
	ctx            context.Context
	args           []string
	flags          any
	store          *store
	stdout, stderr io.Writer
	// damaged is set by a command that found damage and printed it: exit
	// status 1 without an error of its own.
	damaged bool
}

var commands = []*command{
	shardsCommand, manifestCommand, partsCommand, tailCommand,
	leasesCommand, leaseCommand, fleetCommand,
	verifyCommand, releaseLeaseCommand, backfillCommand,
}

// run runs l0ctl with args (without the program's name) and returns its exit
// status. An interrupt cancels the command's requests.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	var cmd *command
	for _, c := range commands {
		if c.name == args[0] {
			cmd = c
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "l0ctl: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	fs := flag.NewFlagSet("l0ctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf storeFlags
	sf.register(fs)
	var own any
	if cmd.flags != nil {
		own = cmd.flags(fs)
	}
	// The flag package prints a flag's error; the help goes to stdout, on -h
	// only.
	fs.Usage = func() {}
	pos, err := parseInterleaved(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		commandHelp(stdout, cmd, fs)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "run l0ctl %s -h for help\n", cmd.name)
		return 2
	}
	if len(pos) < cmd.min || (cmd.max >= 0 && len(pos) > cmd.max) {
		want := "no arguments"
		if cmd.args != "" {
			want = cmd.args
		}
		fmt.Fprintf(stderr, "l0ctl %s: want %s, got %d arguments\nrun l0ctl %s -h for help\n", cmd.name, want, len(pos), cmd.name)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if sf.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, sf.timeout)
		defer cancel()
	}
	s, err := openStore(ctx, sf)
	if err != nil {
		fmt.Fprintf(stderr, "l0ctl %s: %v\n", cmd.name, err)
		if isUsage(err) {
			return 2
		}
		return 1
	}
	defer s.Close()
	c := &call{ctx: ctx, args: pos, flags: own, store: s, stdout: stdout, stderr: stderr}
	if err := cmd.run(c); err != nil {
		fmt.Fprintf(stderr, "l0ctl %s: %v\n", cmd.name, err)
		if isUsage(err) {
			return 2
		}
		return 1
	}
	if c.damaged {
		return 1
	}
	return 0
}

// commandHelp writes cmd's help to w.
func commandHelp(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: l0ctl %s -replica NAME=URL... [flags]", cmd.name)
	if cmd.args != "" {
		fmt.Fprintf(w, " %s", cmd.args)
	}
	fmt.Fprintf(w, "\n\n%s.\n", cmd.summary)
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s", cmd.help)
	}
	fmt.Fprintf(w, "\n%s\nflags:\n", storageHelp)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments (l0ctl manifest orders-7 -replica ...), and returns the
// latter; "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `l0ctl inspects, verifies and repairs a store that l0 engines write.

usage: l0ctl COMMAND -replica NAME=URL [-replica NAME=URL ...] [flags] [args]

`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.summary)
	}
	tw.Flush()
	fmt.Fprintf(w, `
A store is a set of named replicas (-replica NAME=URL, URL gcs://BUCKET, s3://BUCKET
or dir:///PATH), one of them the authority, where the manifests and the leases are:
the first given, unless -authority NAME. Name them as the engines do
(engine.Options.Replicas): manifests record parts' copies by replica name.

Exit status: 0 on success (for verify, a healthy store), 1 on a failure (for verify,
any damage), 2 on a usage error. l0ctl COMMAND -h describes a command.
`)
}

// table writes aligned columns to w; flush it when done.
func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// writeJSON writes v to w, indented.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
