package leakcheck

import (
	"strings"
	"testing"
	"time"
)

//go:noinline
func blockedOn(c chan struct{}) { <-c }

// TestFindReportsAGoroutineStillRunningAndNotOneThatEnded: a goroutine blocked on
// a channel is reported, with its function; ignored by its top function, it is
// not; once the channel closes, it ends within the wait and nothing is reported.
func TestFindReportsAGoroutineStillRunningAndNotOneThatEnded(t *testing.T) {
	if leaks := Find(time.Second); len(leaks) != 0 {
		t.Fatalf("before the goroutine starts, found: %v", leaks)
	}
	c := make(chan struct{})
	started := make(chan struct{})
	go func() {
		close(started)
		blockedOn(c)
	}()
	<-started
	leaks := Find(50 * time.Millisecond)
	if len(leaks) != 1 || !strings.Contains(leaks[0], "leakcheck.blockedOn(") {
		t.Fatalf("found %d goroutines, want the one in blockedOn: %v", len(leaks), leaks)
	}
	const f = "github.com/l0store/l0/internal/leakcheck.blockedOn"
	if got := top(leaks[0]); got != f {
		t.Fatalf("top function %q, want %q", got, f)
	}
	if leaks := Find(50*time.Millisecond, f); len(leaks) != 0 {
		t.Fatalf("ignored by its top function, still found: %v", leaks)
	}
	go func() { time.Sleep(20 * time.Millisecond); close(c) }()
	if leaks := Find(5 * time.Second); len(leaks) != 0 {
		t.Fatalf("after the channel closed, found: %v", leaks)
	}
}
