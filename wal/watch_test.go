package wal

import (
	"context"
	"testing"
	"time"
)

// A watcher is woken by an acknowledged append past the end it saw, by a reset
// of the shard, and by Close; it is not woken by an append of another shard.
func TestWatchWakesOnAckResetAndClose(t *testing.T) {
	l, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.SetEpoch("a", 1); err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch("b", 1); err != nil {
		t.Fatal(err)
	}
	end, ch := l.Watch("a")
	if end != 0 {
		t.Fatalf("a new shard's acknowledged end is %d", end)
	}
	if _, err := l.Append(ctx, "b", 1, [][]byte{[]byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Fatal("an append of shard b woke a watcher of a")
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := l.Append(ctx, "a", 1, [][]byte{[]byte("x"), []byte("y")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("an acknowledged append did not wake the watcher")
	}
	end, ch = l.Watch("a")
	if end != 2 {
		t.Fatalf("after an append of two records the acknowledged end is %d", end)
	}
	// Every page of it sealed elsewhere: the shard continues at 10.
	if _, err := l.Adopt("a", 1, 10, false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("a reset did not wake the watcher")
	}
	end, ch = l.Watch("a")
	if end != 10 {
		t.Fatalf("after the reset to 10 the acknowledged end is %d", end)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the watcher")
	}
	if _, ch := l.Watch("a"); ch == nil {
		t.Fatal("Watch after Close returned no channel")
	} else {
		<-ch
	}
}
