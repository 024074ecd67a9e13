package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/wal"
)

var ioSweep = flag.String("iosweep", "", `"full": TestTheIthLocalIOErrorSurfacesAndLosesNothing fails every local I/O operation of each engine life in turn; by default every ioSweepStride-th`)

const (
	envIOChild = "L0_IOERR_CHILD_DIR" // the child's root: its engine in root/l0, its bucket in root/bucket
	envIOIndex = "L0_IOERR_INDEX"     // the op that fails, from 0; -1: none
	envIOLife  = "L0_IOERR_LIFE"      // which ioLife
	envIOTrace = "L0_IOERR_TRACE"     // set: the child reports every op

	ioBatches   = 12 // appends in a life
	ioBatchRecs = 4  // records per append
	// The default run fails every ioSweepStride-th op of each life, the k-th life
	// starting at op k: a third of each life, the two fresh lives (whose opens are
	// the same ops) covering two thirds of their open between them, and a stride
	// prime to the two ops of an append (write, sync) failing both in turn.
	// -iosweep full fails every op of every life.
	ioSweepStride = 3
	ioChildren    = 2 // children at a time
	ioChildHang   = 90 * time.Second
)

// ioLife is one kind of engine life the sweep runs.
type ioLife struct {
	name string
	mode engine.Durability
	// explicit: the test seals with sh.Seal after every fourth append, the
	// scheduler's triggers off, so a seal's local I/O errors reach the caller; else
	// the scheduler seals by a small size trigger, in the background, retrying.
	explicit bool
	// prelude: before the life, with nothing failing and no op counted, an
	// engine on the same Dir appends this many batches and closes without sealing
	// them, so the life's open recovers a WAL (pebble's replay, the watermark, the
	// instance and incarnation files) and its OpenShard adopts and seals its pages.
	prelude int
}

var ioLives = []ioLife{
	{name: "remote-background-seals", mode: engine.Remote},
	{name: "local-explicit-seals", mode: engine.Local, explicit: true},
	{name: "reopen-local-background-seals", mode: engine.Local, prelude: 6},
}

// batches is how many batches the child offers, prelude included.
func (l ioLife) batches() int { return l.prelude + ioBatches }

// TestTheIthLocalIOErrorSurfacesAndLosesNothing is the error-index sweep over the
// engine's local file system (Options.FS: the WAL and its watermark, part files,
// upload temporaries, the instance id and incarnation): for i = 0, 1, 2, ... the
// i-th local I/O operation of an engine's life (open, OpenShard, a dozen appends,
// seals, the shard's Close, the engine's Close) fails, until a run passes with
// none injected. Each life runs in a child process, since pebble makes some I/O
// errors fatal (its Logger's Fatalf, which the WAL turns into a panic: fail-stop),
// and reports what it acknowledged and every error it was told.
//
// After each run a clean engine on the same directory and bucket reads back every
// acknowledged record at its offset, byte for byte, exactly once and in order, and
// no record of an append that was refused (an error other than
// shard.ErrOutcomeUnknown promises nothing was written). Every error a call
// returned must follow the injection and say what happened: it wraps
// errorfs.ErrInjected, or is wal.ErrFailed (the WAL refusing everything after a
// failed sync or commit). A child may only die by pebble's fatal error (a crash:
// what it acknowledged must survive it). No call may absorb an error that broke its
// promise: the live shard's read before its Close yields every acknowledged record
// at its offset unless it fails; a shard Close that returned nil sealed everything
// in the WAL; an engine Close that returned nil left the acknowledged watermark
// covering every acknowledged record (DESIGN.md §4: after a clean Close nothing is
// uncovered).
//
// A life's ops are counted from any goroutine, so the i-th is not always the same
// op: each run reports the op it failed. By default a third of each life's ops
// fail (see ioSweepStride), a tenth under -short; -args -iosweep full fails every
// one, and -v lists every run.
func TestTheIthLocalIOErrorSurfacesAndLosesNothing(t *testing.T) {
	if root := os.Getenv(envIOChild); root != "" {
		ioChild(root)
		return
	}
	for k, life := range ioLives {
		t.Run(life.name, func(t *testing.T) { ioSweepLife(t, life, k) })
	}
}

// ioSweepLife sweeps the k-th life.
func ioSweepLife(t *testing.T, life ioLife, k int) {
	start := time.Now()
	base := t.TempDir()
	var seq atomic.Int64
	// run runs and verifies one life with op at failing; a verification failure
	// is reported with t.Errorf (safe from the workers).
	run := func(at int) *ioRun {
		root := filepath.Join(base, strconv.FormatInt(seq.Add(1), 10))
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Error(err)
			return nil
		}
		r := runIOChild(root, life, at)
		if err := r.verify(root); err != nil {
			t.Errorf("%s, op %d failing: %v\n%s", life.name, at, err, r.describe())
			r.failed = true
			return r
		}
		os.RemoveAll(root)
		return r
	}

	// A clean life: how many ops it has.
	clean := run(-1)
	if clean == nil || clean.failed {
		t.Fatalf("%s: the life without an injected error fails", life.name)
	}
	if clean.ops == 0 || clean.injected != nil {
		t.Fatalf("%s: the clean life counted %d ops", life.name, clean.ops)
	}
	t.Logf("%s: a clean life has %d local I/O ops, %d of them in engine.Open (%s)", life.name, clean.ops, clean.opened, clean.took.Round(time.Millisecond))

	stride, index := ioSweepStride, k%ioSweepStride
	switch {
	case *ioSweep == "full":
		stride, index = 1, 0
	case testing.Short():
		// A short run still sweeps each life, a tenth of its ops: a few dozen
		// children rather than hundreds.
		stride, index = 10, k%10
	}
	limit := 3*clean.ops + 200
	var (
		mu      sync.Mutex
		results []*ioRun
		ended   bool // a run injected nothing: no more indices
		wg      sync.WaitGroup
	)
	for range ioChildren {
		wg.Go(func() {
			for {
				mu.Lock()
				if ended || index > limit {
					mu.Unlock()
					return
				}
				at := index
				index += stride
				mu.Unlock()
				r := run(at)
				if r == nil {
					return
				}
				mu.Lock()
				results = append(results, r)
				if r.injected == nil {
					ended = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if !ended {
		t.Fatalf("%s: the sweep did not end by op %d: every run hit an injected failure", life.name, limit)
	}
	slices.SortFunc(results, func(a, b *ioRun) int { return a.at - b.at })

	var runs, injected, surfaced, fatal, absorbed, logged, failed int
	var slowest time.Duration
	byKind := map[string][3]int{} // op kind: surfaced, fatal, absorbed
	var silent []string
	for _, r := range results {
		runs++
		slowest = max(slowest, r.took)
		if r.failed {
			failed++
		}
		if r.injected == nil {
			continue
		}
		injected++
		c := byKind[r.injected.kind]
		switch {
		case r.crashed:
			fatal++
			c[1]++
		case len(r.errs) > 0:
			surfaced++
			c[0]++
		default:
			absorbed++
			c[2]++
			if len(r.logs) > 0 {
				logged++
			} else {
				silent = append(silent, fmt.Sprintf("%d %s %s", r.at, r.injected.kind, r.injected.path))
			}
		}
		byKind[r.injected.kind] = c
	}
	t.Logf("%s: %d runs (+1 clean), %d injected: %d surfaced as an API error, %d fatal (the child crashed), %d absorbed (%d of them logged); %d failed verification; %s, the slowest child %s",
		life.name, runs, injected, surfaced, fatal, absorbed, logged, failed, time.Since(start).Round(time.Second), slowest.Round(time.Millisecond))
	for _, kind := range slices.Sorted(maps.Keys(byKind)) {
		c := byKind[kind]
		t.Logf("%s:   %-14s surfaced %3d  fatal %3d  absorbed %3d", life.name, kind, c[0], c[1], c[2])
	}
	if testing.Verbose() {
		for _, r := range results {
			t.Logf("%s: %s", life.name, r.summary())
		}
	}
	if testing.Verbose() && len(silent) > 0 {
		t.Logf("%s: absorbed without a log line (nothing lost): %s", life.name, strings.Join(silent, "; "))
	}
}

// ioOp is an injected op, as the child reports it.
type ioOp struct {
	index int
	kind  string
	path  string
}

// ioErr is an error a call returned in the child.
type ioErr struct {
	call  string // open, open-shard, append, seal, read, close-shard, close
	batch int    // the append's or seal's batch, the records a read yielded, else -1
	class string // what it wraps (see ioErrClass)
	msg   string
	after bool // reported after the injection
}

// ioRun is what a child reported, and how it ended.
type ioRun struct {
	life     ioLife
	at       int
	injected *ioOp
	tried    map[int]bool   // batches offered to Append
	acked    map[int]uint64 // acknowledged batches: first offset
	refused  map[int]ioErr  // batches whose append returned a refusal (not ErrOutcomeUnknown)
	errs     []ioErr
	logs     []string // the engine's warnings and errors, after the injection
	ops      int
	opened   int // ops when the engine's Open returned
	done     bool
	crashed  bool   // died by pebble's fatal error
	panicAt  string // the function that panicked, if the child did
	exit     string // how it ended, if not cleanly
	stderr   string
	took     time.Duration
	closedOK bool // the engine's Close returned nil
	// read is how many records the live shard read back before its Close, and
	// readBad what was wrong with them; readErr says the read ended in an error.
	read              int
	readBad           string
	readDone, readErr bool
	// shardClosedOK: the shard's Close returned nil, its manifest then sealed to
	// sealed and its WAL ending at next.
	shardClosedOK bool
	sealed, next  uint64
	failed        bool
	lines         []string
}

func runIOChild(root string, life ioLife, at int) *ioRun {
	r := &ioRun{life: life, at: at, tried: map[int]bool{}, acked: map[int]uint64{}, refused: map[int]ioErr{}}
	ctx, cancel := context.WithTimeout(context.Background(), ioChildHang)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestTheIthLocalIOErrorSurfacesAndLosesNothing$", "-test.count=1")
	cmd.Env = append(os.Environ(), envIOChild+"="+root, envIOIndex+"="+strconv.Itoa(at), envIOLife+"="+life.name,
		// The race detector waits a second at exit for reports of racing
		// goroutines by default: a second per child, most of the sweep's time.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) } // a hang shows its goroutines
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r.took = time.Since(start)
	r.stderr = stderr.String()
	switch {
	case ctx.Err() != nil:
		r.exit = fmt.Sprintf("hung: killed after %s", ioChildHang)
	case err != nil:
		r.exit = err.Error()
		// Pebble's fatal errors are panics: through its Logger's Fatalf, which the
		// WAL's pebbleLogger turns into one, or its own (a failed directory sync
		// after moving a marker, say). That is the fail-stop the design chose; any
		// other panic is a bug.
		r.panicAt = panicOrigin(r.stderr)
		r.crashed = strings.HasPrefix(r.panicAt, "github.com/l0store/l0/wal.pebbleLogger.Fatalf") ||
			strings.HasPrefix(r.panicAt, "github.com/cockroachdb/pebble/")
	}
	injected := false
	for line := range strings.Lines(stdout.String()) {
		line = strings.TrimSuffix(line, "\n")
		r.lines = append(r.lines, line)
		word, rest, _ := strings.Cut(line, " ")
		var (
			n, b  int
			first uint64
			e     ioErr
		)
		switch word {
		case "inject":
			op := &ioOp{}
			if _, err := fmt.Sscanf(rest, "%d %s %q", &op.index, &op.kind, &op.path); err == nil {
				r.injected, injected = op, true
			}
		case "try":
			if _, err := fmt.Sscanf(rest, "%d", &b); err == nil {
				r.tried[b] = true
			}
		case "ack":
			if _, err := fmt.Sscanf(rest, "%d %d", &b, &first); err == nil {
				r.acked[b] = first
			}
		case "err":
			if _, err := fmt.Sscanf(rest, "%s %d %s %q", &e.call, &e.batch, &e.class, &e.msg); err == nil {
				e.after = injected
				r.errs = append(r.errs, e)
				if e.call == "read" {
					r.readErr = true
				}
				if e.call == "append" && !strings.Contains(e.class, "unknown") {
					r.refused[e.batch] = e
				}
			}
		case "log":
			if injected {
				r.logs = append(r.logs, rest)
			}
		case "ops":
			fmt.Sscanf(rest, "%d", &n)
			r.ops = n
		case "opened":
			fmt.Sscanf(rest, "%d", &r.opened)
		case "read":
			var bad string
			if _, err := fmt.Sscanf(rest, "%d %q", &n, &bad); err == nil {
				r.read, r.readBad, r.readDone = n, bad, true
			}
		case "shard-closed":
			if _, err := fmt.Sscanf(rest, "%d %d", &r.sealed, &r.next); err == nil {
				r.shardClosedOK = true
			}
		case "closed":
			r.closedOK = true
		case "done":
			r.done = true
		}
	}
	return r
}

// verify checks what the child told against what a clean engine on its directory
// and bucket reads back.
func (r *ioRun) verify(root string) error {
	if r.exit != "" && !r.crashed {
		return fmt.Errorf("the child did not end cleanly nor by pebble's fatal error: %s", r.exit)
	}
	if r.crashed && r.injected == nil {
		return fmt.Errorf("the child died by a fatal error with nothing injected")
	}
	if !r.crashed && !r.done {
		return fmt.Errorf("the child ended without finishing its life")
	}
	for _, e := range r.errs {
		if !e.after {
			return fmt.Errorf("%s returned an error before anything was injected: %s", e.call, e.msg)
		}
		ok := strings.Contains(e.class, "injected") || strings.Contains(e.class, "failed")
		if e.call == "append" && strings.Contains(e.class, "unknown") && !ok {
			return fmt.Errorf("append %d: outcome unknown, but not for the injected error: %s", e.batch, e.msg)
		}
		if !ok {
			return fmt.Errorf("%s (batch %d) returned an error that neither wraps errorfs.ErrInjected nor is wal.ErrFailed (%s): %s", e.call, e.batch, e.class, e.msg)
		}
	}
	if r.injected != nil && r.injected.index != r.at {
		return fmt.Errorf("the child injected at op %d, asked for %d", r.injected.index, r.at)
	}

	var end uint64 // of the acknowledged records
	for _, first := range r.acked {
		end = max(end, first+ioBatchRecs)
	}
	// The live shard read every acknowledged record, or failed.
	if r.readDone && r.readBad != "" {
		return fmt.Errorf("the live shard's read: %s", r.readBad)
	}
	if r.readDone && !r.readErr && uint64(r.read) < end {
		return fmt.Errorf("the live shard's read ended without an error after %d records, %d acknowledged", r.read, end)
	}
	// A shard's Close that returned nil sealed everything (DESIGN.md §8: the next
	// owner has nothing to seal).
	if r.shardClosedOK && (r.sealed < r.next || r.sealed < end) {
		return fmt.Errorf("the shard closed without an error, sealed to %d, its WAL ending at %d, %d acknowledged", r.sealed, r.next, end)
	}
	// An engine's Close that returned nil leaves nothing uncovered by the
	// acknowledged watermark (DESIGN.md §4).
	dir := filepath.Join(root, "l0")
	if r.closedOK && len(r.acked) > 0 {
		marks, err := readAckedFile(filepath.Join(dir, "wal", "l0-acked"))
		if err != nil {
			return fmt.Errorf("the engine closed without an error, but its acknowledged watermark: %v", err)
		}
		if m := marks["s"]; m[1] < end {
			return fmt.Errorf("the engine closed without an error, but its acknowledged watermark covers shard s to %d, %d acknowledged", m[1], end)
		}
	}

	ctx := context.Background()
	bucket, err := localBucket(root)
	if err != nil {
		return err
	}
	defer bucket.Close()
	e, err := engine.Open(ctx, engine.Options{Dir: dir, Bucket: bucket})
	if err != nil {
		return fmt.Errorf("reopen: %w", err)
	}
	sh, err := e.OpenShard(ctx, "s")
	if err != nil {
		e.Close()
		return fmt.Errorf("reopen shard: %w", err)
	}
	var got [][]byte
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			e.Close()
			return fmt.Errorf("read after %d records: %w", len(got), err)
		}
		if rec.Offset != uint64(len(got)) {
			e.Close()
			return fmt.Errorf("offset %d after %d records", rec.Offset, len(got))
		}
		got = append(got, rec.Value)
	}
	info, stranded := sh.Info(), e.Metrics().StrandedRecords
	if err := errors.Join(sh.Close(ctx), e.Close()); err != nil {
		return fmt.Errorf("close after the reopen: %w", err)
	}
	if info.Next != uint64(len(got)) {
		return fmt.Errorf("next offset %d, %d records", info.Next, len(got))
	}
	if stranded != 0 {
		return fmt.Errorf("%d records counted stranded", stranded)
	}

	// Whole batches, in order, each at most once, each one an append that may have
	// written it.
	at := map[int]uint64{}
	last := -1
	for off := 0; off < len(got); {
		b, k, ok := ioParse(got[off])
		if !ok || k != 0 || b <= last {
			return fmt.Errorf("offset %d holds %.20q after batch %d", off, got[off], last)
		}
		if off+ioBatchRecs > len(got) {
			return fmt.Errorf("batch %d at %d is cut short: %d records", b, off, len(got))
		}
		for k, rec := range ioBatch(b) {
			if !bytes.Equal(got[off+k], rec) {
				return fmt.Errorf("offset %d holds %.20q, want record %d of batch %d", off+k, got[off+k], k, b)
			}
		}
		switch {
		case !r.tried[b]:
			return fmt.Errorf("batch %d at %d was never appended", b, off)
		case r.refused[b].call != "":
			return fmt.Errorf("batch %d is at %d, but its append was refused (%s): %s", b, off, r.refused[b].class, r.refused[b].msg)
		}
		at[b] = uint64(off)
		last = b
		off += ioBatchRecs
	}
	for b, first := range r.acked {
		o, ok := at[b]
		switch {
		case !ok:
			return fmt.Errorf("acknowledged batch %d (at %d) lost: %d records read back", b, first, len(got))
		case o != first:
			return fmt.Errorf("acknowledged batch %d at %d reads back at %d", b, first, o)
		}
	}
	// Without an injection, or one that nothing surfaced, nothing is missing.
	if !r.crashed && len(r.errs) == 0 && len(at) != r.life.batches() {
		return fmt.Errorf("%d of %d batches read back, and no call failed", len(at), r.life.batches())
	}
	return nil
}

func (r *ioRun) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  ran %s; ", r.took.Round(time.Millisecond))
	if r.injected != nil {
		fmt.Fprintf(&b, "injected at op %d: %s %s\n", r.injected.index, r.injected.kind, r.injected.path)
	} else {
		fmt.Fprintf(&b, "nothing injected\n")
	}
	for _, l := range r.lines {
		if !strings.HasPrefix(l, "try ") {
			fmt.Fprintf(&b, "  child: %s\n", l)
		}
	}
	if r.exit != "" {
		fmt.Fprintf(&b, "  exit: %s; panicked in %s\n", r.exit, r.panicAt)
		s := r.stderr
		if len(s) > 6000 {
			s = s[:6000] + "..."
		}
		fmt.Fprintf(&b, "  stderr:\n%s", s)
	}
	return b.String()
}

// summary is one line on the run: what failed, and what the child saw.
func (r *ioRun) summary() string {
	var b strings.Builder
	if r.injected == nil {
		fmt.Fprintf(&b, "op %d: none injected", r.at)
	} else {
		fmt.Fprintf(&b, "op %d %s %s:", r.at, r.injected.kind, r.injected.path)
	}
	fmt.Fprintf(&b, " %d acked", len(r.acked))
	if r.crashed {
		fmt.Fprintf(&b, "; fatal in %s", r.panicAt)
	}
	for _, e := range r.errs {
		fmt.Fprintf(&b, "; %s", e.call)
		if e.batch >= 0 {
			fmt.Fprintf(&b, " %d", e.batch)
		}
		fmt.Fprintf(&b, " [%s] %s", e.class, e.msg)
	}
	if len(r.errs) == 0 && !r.crashed && len(r.logs) > 0 {
		fmt.Fprintf(&b, "; logged: %s", r.logs[0])
	}
	if r.failed {
		b.WriteString("; FAILED")
	}
	return b.String()
}

// panicOrigin returns the function that raised the panic a Go traceback reports:
// the panicking goroutine's first frame, or, if deferred calls re-panicked, the
// frame below its last panic call.
func panicOrigin(stderr string) string {
	_, trace, ok := strings.Cut(stderr, "panic: ")
	if !ok {
		return ""
	}
	_, stack, ok := strings.Cut(trace, "\ngoroutine ")
	if !ok {
		return ""
	}
	stack, _, _ = strings.Cut(stack, "\n\n")
	lines := strings.Split(stack, "\n") // "59 [running]:", then function and file lines
	origin := ""
	if len(lines) > 1 {
		origin = lines[1]
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "panic(") && i+2 < len(lines) {
			origin = lines[i+2]
		}
	}
	return origin
}

// ioBatch is batch b's records: "b<b> r<k>" and padding.
func ioBatch(b int) [][]byte {
	recs := make([][]byte, ioBatchRecs)
	for k := range recs {
		recs[k] = fmt.Appendf(nil, "b%02d r%d %s", b, k, bytes.Repeat([]byte{'x'}, 100))
	}
	return recs
}

// ioParse returns the batch and index of a record ioBatch made.
func ioParse(rec []byte) (b, k int, ok bool) {
	if _, err := fmt.Sscanf(string(rec), "b%d r%d", &b, &k); err != nil || b < 0 || k < 0 || k >= ioBatchRecs {
		return 0, 0, false
	}
	return b, k, true
}

// readAckedFile decodes the WAL's acknowledged watermark (format in wal/acked.go):
// per shard its floor and acknowledged end (version 2 follows them with the
// shard's epoch and last reset, which this test does not look at).
func readAckedFile(path string) (map[string][2]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	const head = len("l0ack") + 1 + 4
	if len(b) < head+4 || string(b[:5]) != "l0ack" || (b[5] != 1 && b[5] != 2) {
		return nil, fmt.Errorf("%s: not a watermark file", path)
	}
	markLen := 16 // floor, acked
	if b[5] == 2 {
		markLen = 32 // and epoch, reset
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)) != binary.BigEndian.Uint32(b[len(body):]) {
		return nil, fmt.Errorf("%s: checksum mismatch", path)
	}
	n, rest := binary.BigEndian.Uint32(b[6:]), body[head:]
	out := map[string][2]uint64{}
	for range n {
		l, k := binary.Uvarint(rest)
		if k <= 0 || uint64(len(rest)-k) < l+uint64(markLen) {
			return nil, fmt.Errorf("%s: truncated", path)
		}
		id := string(rest[k : k+int(l)])
		rest = rest[k+int(l):]
		out[id] = [2]uint64{binary.BigEndian.Uint64(rest), binary.BigEndian.Uint64(rest[8:])}
		rest = rest[markLen:]
	}
	return out, nil
}

// ioChild is one engine life on root with op L0_IOERR_INDEX failing, reporting on
// stdout: "inject i kind path" when it fails the op, "try b" before each append,
// "ack b first" after each acknowledged one, "err call b class msg" for each
// error a call returned, "log ..." for the engine's warnings and errors, "opened
// n" when the engine's Open returned after n ops, "read n bad" when the shard's
// read before its Close yielded n records (bad: what was wrong with them, if
// anything), "shard-closed sealed next" when the shard's Close returned nil (its
// manifest's sealed watermark, its WAL's end), "closed" when the engine's Close
// returned nil, then "ops n" and "done". A prelude's ops are not counted.
func ioChild(root string) {
	ctx := context.Background()
	at, err := strconv.Atoi(os.Getenv(envIOIndex))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	i := slices.IndexFunc(ioLives, func(l ioLife) bool { return l.name == os.Getenv(envIOLife) })
	if i < 0 {
		fmt.Fprintln(os.Stderr, "child: no life", os.Getenv(envIOLife))
		os.Exit(2)
	}
	life := ioLives[i]
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
		w.Flush()
	}
	inj := &nthOp{at: int64(at), root: root, report: report, trace: os.Getenv(envIOTrace) != ""}
	bucket, err := localBucket(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: bucket:", err)
		os.Exit(2)
	}
	inert := seal.Options{SizeBytes: 1 << 40, WALBytes: 1 << 40, Age: time.Hour, Interval: time.Hour}
	opts := engine.Options{
		Dir: filepath.Join(root, "l0"), FS: errorfs.Wrap(vfs.Default, inj), Bucket: bucket, Durability: life.mode,
		Logger: slog.New(slog.NewTextHandler(logLines{report}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Tail:   engine.TailOptions{Interval: 5 * time.Millisecond},
		Seal:   seal.Options{SizeBytes: 2 << 10, Interval: 5 * time.Millisecond, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond},
	}
	if life.explicit {
		opts.Seal = inert
	}
	acked := map[int]uint64{} // batch: first offset
	if life.prelude > 0 {
		pre := opts
		pre.Seal = inert
		if err := ioPrelude(ctx, pre, life.prelude, acked, report); err != nil {
			fmt.Fprintln(os.Stderr, "child: prelude:", err)
			os.Exit(2)
		}
	}
	inj.armed.Store(true)
	fail := func(call string, b int, err error) {
		report("err %s %d %s %q", call, b, ioErrClass(err), err.Error())
	}
	if e, err := engine.Open(ctx, opts); err != nil {
		fail("open", -1, err)
	} else {
		report("opened %d", inj.n.Load())
		if sh, err := e.OpenShard(ctx, "s"); err != nil {
			fail("open-shard", -1, err)
		} else {
			for b := life.prelude; b < life.batches(); b++ {
				report("try %d", b)
				if first, err := sh.Append(ctx, ioBatch(b)...); err != nil {
					fail("append", b, err)
				} else {
					acked[b] = first
					report("ack %d %d", b, first)
				}
				if !life.explicit {
					time.Sleep(2 * time.Millisecond) // let seals interleave
				} else if b%4 == 3 {
					if _, err := sh.Seal(ctx, 1<<10); err != nil {
						fail("seal", b, err)
					}
				}
			}
			// The live shard's view after whatever failed: every acknowledged
			// record, at its offset, or an error.
			n, bad := 0, ""
			for rec, err := range sh.Read(ctx, 0) {
				if err != nil {
					fail("read", n, err)
					break
				}
				b, k, ok := ioParse(rec.Value)
				switch first, isAcked := acked[b]; {
				case rec.Offset != uint64(n):
					bad = fmt.Sprintf("offset %d after %d records", rec.Offset, n)
				case !ok || !bytes.Equal(rec.Value, ioBatch(b)[k]):
					bad = fmt.Sprintf("offset %d holds %.20q", rec.Offset, rec.Value)
				case isAcked && rec.Offset != first+uint64(k):
					bad = fmt.Sprintf("offset %d holds record %d of batch %d, acknowledged at %d", rec.Offset, k, b, first)
				}
				if bad != "" {
					break
				}
				n++
			}
			report("read %d %q", n, bad)
			if err := sh.Close(ctx); err != nil {
				fail("close-shard", -1, err)
			} else {
				report("shard-closed %d %d", sh.Manifest().Sealed, sh.Info().Next)
			}
		}
		if err := e.Close(); err != nil {
			fail("close", -1, err)
		} else {
			report("closed")
		}
	}
	bucket.Close()
	report("ops %d", inj.n.Load())
	report("done")
}

// ioPrelude appends batches 0 to n-1 on an engine of opts and closes it, leaving
// the pages in its WAL.
func ioPrelude(ctx context.Context, opts engine.Options, n int, acked map[int]uint64, report func(string, ...any)) error {
	e, err := engine.Open(ctx, opts)
	if err != nil {
		return err
	}
	sh, err := e.OpenShard(ctx, "s")
	if err != nil {
		e.Close()
		return err
	}
	for b := range n {
		report("try %d", b)
		first, err := sh.Append(ctx, ioBatch(b)...)
		if err != nil {
			e.Close()
			return err
		}
		acked[b] = first
		report("ack %d %d", b, first)
	}
	return e.Close() // retires the shard: its pages stay in the WAL
}

// ioErrClass names what err wraps, for the parent: "injected" (errorfs.ErrInjected),
// "unknown" (shard.ErrOutcomeUnknown), "failed" (wal.ErrFailed), "closed",
// "fenced"; "other" if none.
func ioErrClass(err error) string {
	var c []string
	for _, k := range []struct {
		name string
		errs []error
	}{
		{"injected", []error{errorfs.ErrInjected}},
		{"unknown", []error{shard.ErrOutcomeUnknown, wal.ErrUnknownOutcome}},
		{"failed", []error{wal.ErrFailed}},
		{"closed", []error{shard.ErrClosed, wal.ErrClosed, engine.ErrClosed}},
		{"fenced", []error{manifest.ErrFenced}},
	} {
		if slices.ContainsFunc(k.errs, func(e error) bool { return errors.Is(err, e) }) {
			c = append(c, k.name)
		}
	}
	if len(c) == 0 {
		return "other"
	}
	return strings.Join(c, ",")
}

// nthOp is an errorfs.Injector that fails op number at (from 0) of every op the
// engine's file system sees, from any goroutine, and counts them.
type nthOp struct {
	armed  atomic.Bool // ops are counted, and one failed, once armed
	n      atomic.Int64
	at     int64
	root   string
	report func(string, ...any)
	trace  bool
}

func (o *nthOp) String() string { return fmt.Sprintf("op %d", o.at) }

func (o *nthOp) MaybeError(op errorfs.Op) error {
	if !o.armed.Load() {
		return nil
	}
	i := o.n.Add(1) - 1
	path := strings.TrimPrefix(op.Path, o.root+"/")
	if o.trace {
		o.report("op %d %s %s", i, ioKind(op.Kind), path)
	}
	if i != o.at {
		return nil
	}
	o.report("inject %d %s %q", i, ioKind(op.Kind), path)
	return errorfs.ErrInjected
}

func ioKind(k errorfs.OpKind) string {
	names := map[errorfs.OpKind]string{
		errorfs.OpCreate: "create", errorfs.OpLink: "link", errorfs.OpOpen: "open", errorfs.OpOpenDir: "open-dir",
		errorfs.OpRemove: "remove", errorfs.OpRemoveAll: "remove-all", errorfs.OpRename: "rename",
		errorfs.OpReuseForWrite: "reuse-for-write", errorfs.OpMkdirAll: "mkdir-all", errorfs.OpLock: "lock",
		errorfs.OpList: "list", errorfs.OpFilePreallocate: "preallocate", errorfs.OpStat: "stat",
		errorfs.OpGetDiskUsage: "disk-usage", errorfs.OpFileClose: "close", errorfs.OpFileRead: "read",
		errorfs.OpFileReadAt: "read-at", errorfs.OpFileWrite: "write", errorfs.OpFileWriteAt: "write-at",
		errorfs.OpFileStat: "file-stat", errorfs.OpFileSync: "sync", errorfs.OpFileSyncData: "sync-data",
		errorfs.OpFileSyncTo: "sync-to", errorfs.OpFileFlush: "flush",
	}
	if n, ok := names[k]; ok {
		return n
	}
	return fmt.Sprintf("op%d", int(k))
}

// logLines reports each of the engine's log records as a "log" line.
type logLines struct{ report func(string, ...any) }

func (l logLines) Write(p []byte) (int, error) {
	l.report("log %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

var _ io.Writer = logLines{}
