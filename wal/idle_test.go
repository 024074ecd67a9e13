package wal

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// errRefused is an injected failure of one file-system call.
var errRefused = errors.New("injected: refused")

// TestIdleOpensDoNotKeepSegments: lives that write nothing of their own (opens
// then Closes, a kill while idle, an open killed or failing after making its
// segment) alternate with lives that append and seal everything, over many small
// segments.
// Every page sealed, the directory must hold at most 2+RecycleSegments segment
// files after every Close: the current segment, the one before it while the
// current one's checkpoint is not yet synced, and the files kept for reuse.
func TestIdleOpensDoNotKeepSegments(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewMem()
	opts := Options{SegmentSize: 4 << 10, RecycleSegments: 1, AckedInterval: time.Hour}
	bound := 2 + opts.RecycleSegments
	big := []byte(strings.Repeat("x", 900))
	var end uint64 // the shard's acknowledged end, all of it sealed

	lifeOn := func(lf *life) Options {
		o := opts
		o.FS = lifeFS{FS: mem, life: lf}
		return o
	}
	check := func(round int, after string, l *Log) {
		t.Helper()
		if info := l.Info("s"); info.Floor != end || info.Next != end {
			t.Fatalf("round %d, %s: the shard opens at floor %d next %d, sealed through %d", round, after, info.Floor, info.Next, end)
		}
	}
	files := func(round int, after string) {
		t.Helper()
		names, err := mem.List("wal")
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		n := 0
		for _, name := range names {
			if _, ok := parseSegmentName(name); ok {
				n++
			}
		}
		if n > bound {
			t.Fatalf("round %d, after %s: every page sealed, yet %d segment files, at most %d expected: %v", round, after, n, bound, names)
		}
	}
	// appendAndSeal appends k pages, sealing each.
	appendAndSeal := func(l *Log, k int) {
		t.Helper()
		for range k {
			off, err := l.Append(ctx, "s", 0, [][]byte{big})
			if err != nil {
				t.Fatal(err)
			}
			end = off + 1
			if err := l.TruncateThrough("s", 0, end); err != nil {
				t.Fatal(err)
			}
		}
	}

	for round := range 50 {
		// Appends and seals, over a few segments.
		l := open(t, "wal", lifeOn(&life{}))
		check(round, "an open after a failed one", l)
		appendAndSeal(l, 12)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		files(round, "appends and seals")

		// Opens and Closes, one after another.
		for range 3 {
			l = open(t, "wal", lifeOn(&life{}))
			check(round, "an open", l)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			files(round, "an open and a Close")
		}

		// An open killed once it made its segment, before that segment's first
		// group is written.
		lf := &life{}
		made := false
		lf.before = func(what string) error {
			switch {
			case strings.HasPrefix(what, "create wal/0") || strings.HasPrefix(what, "reuse "):
				made = true
			case made && strings.HasPrefix(what, "write "):
				lf.kill()
			}
			return nil
		}
		if l, err := Open("wal", lifeOn(lf)); err == nil {
			l.Close()
			t.Fatalf("round %d: the open was not killed before its segment's first group", round)
		}

		// An open, a page appended and sealed, and a kill while idle: the watermark,
		// rewritten only hourly, is left behind the log.
		lf = &life{}
		l = open(t, "wal", lifeOn(lf))
		check(round, "an open after a killed one", l)
		appendAndSeal(l, 1)
		lf.kill()
		l.Close() // the process is gone: nothing reaches the disk

		// An open that fails after making its segment: the rewrite of the watermark
		// it found behind is refused.
		lf = &life{before: func(what string) error {
			if strings.HasPrefix(what, "rename ") {
				return errRefused
			}
			return nil
		}}
		if l, err := Open("wal", lifeOn(lf)); err == nil {
			l.Close()
			t.Fatalf("round %d: the open whose watermark write was refused succeeded", round)
		} else if !errors.Is(err, errRefused) {
			t.Fatalf("round %d: the open failed otherwise: %v", round, err)
		}
	}
	l := open(t, "wal", lifeOn(&life{}))
	check(50, "the last open", l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	files(50, "the last open and a Close")
}
