// Package leakcheck fails a test binary whose tests passed but left goroutines
// running. It reads the stacks of all goroutines (runtime.Stack) after the tests,
// waits a while for the ones still ending, and reports the rest with their stacks.
//
// It is the library's own, in place of a third-party leak checker, so that no
// test-only module enters the module graph of the modules that import l0.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Wait is how long Main waits for goroutines to end before it calls them leaked.
const Wait = 5 * time.Second

// Options adjust Main.
type Options struct {
	// Cleanup runs after the tests and before the check: it stops what the tests
	// shared (a server started once for the package, say).
	Cleanup func()
	// IgnoreTop names functions (as a stack prints them, "pkg.(*T).method") that
	// may be at the top of a goroutine that outlives the tests: workers a
	// dependency starts at init.
	IgnoreTop []string
}

// Main is a TestMain: it runs the tests, then, if they passed, fails the binary
// when goroutines other than the caller's are still running after Wait.
func Main(m *testing.M, o Options) {
	code := m.Run()
	if o.Cleanup != nil {
		o.Cleanup()
	}
	if code == 0 {
		if leaks := Find(Wait, o.IgnoreTop...); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "leakcheck: the tests passed but left %d goroutines running:\n\n%s\n",
				len(leaks), strings.Join(leaks, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// Find returns the stacks of the goroutines, other than the caller's and the
// runtime's and standard library's own, that are still running after wait, or
// none as soon as there are none. A goroutine whose top function is in ignoreTop
// does not count.
func Find(wait time.Duration, ignoreTop ...string) []string {
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		leaks := running(ignoreTop)
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// background are functions found anywhere in the stack of a goroutine the
// runtime or the standard library keeps for the life of the process.
var background = []string{
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime/trace.Start.func1",
	"runtime.ReadTrace",
	"testing.(*M).startAlarm",
	// The goroutine running the tests, when Find is called from one.
	"testing.runTests",
	"testing.runFuzzing",
}

func running(ignoreTop []string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// The first stack is the caller's own.
	stacks := strings.Split(string(bytes.TrimSpace(buf)), "\n\n")[1:]
	var leaks []string
	for _, s := range stacks {
		if !isBackground(s) && !ignored(top(s), ignoreTop) {
			leaks = append(leaks, s)
		}
	}
	return leaks
}

// top is the function of a stack's first frame: the line after the header
// "goroutine N [state]:", without its arguments.
func top(stack string) string {
	lines := strings.SplitN(stack, "\n", 3)
	if len(lines) < 2 {
		return ""
	}
	f := lines[1]
	if i := strings.LastIndex(f, "("); i > 0 {
		f = f[:i]
	}
	return f
}

func isBackground(stack string) bool {
	for _, f := range background {
		if strings.Contains(stack, "\n"+f+"(") {
			return true
		}
	}
	return false
}

func ignored(f string, ignoreTop []string) bool {
	for _, i := range ignoreTop {
		if f == i {
			return true
		}
	}
	return false
}
