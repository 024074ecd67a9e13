package tests

import (
	"google.golang.org/api/option"

	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/l0store/l0/engine"
	"github.com/l0store/l0/seal"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/gcs"
	"github.com/l0store/l0/substrate/local"
)

var kills = flag.Int("kills", 20, "kill points of TestKilledAppenderLosesNoAcknowledgedRecord")

const (
	envCrashChild = "L0_CRASH_CHILD_DIR"
	// The child's bucket directory, if not in its Dir; Local mode; a short lease.
	envCrashBucket     = "L0_CRASH_BUCKET"
	envCrashLocal      = "L0_CRASH_LOCAL"
	envCrashShortLease = "L0_CRASH_SHORT_LEASE"
	envCrashGCS        = "L0_CRASH_GCS" // endpoint|bucket
	crashShards        = 4
	crashWriters       = 3 // per shard
)

// TestKilledAppenderLosesNoAcknowledgedRecord runs a child process that appends from
// several goroutines to several shards and reports every acknowledged batch over a
// pipe, kills it with SIGKILL at a random moment, reopens its directory, and checks
// that every acknowledged record is there, in order, exactly once, at dense offsets,
// whether it was sealed into a part or is still in the WAL. The child seals all the
// time (small triggers), so kill points land in every step of a seal. The directory
// and its bucket are reused across kill points, so later children also recover what
// earlier ones left.
func TestKilledAppenderLosesNoAcknowledgedRecord(t *testing.T) {
	if dir := os.Getenv(envCrashChild); dir != "" {
		crashChild(dir)
		return
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acked := map[string][]batch{}
	parts := 0
	for kill := range *kills {
		delay := time.Duration(rng.IntN(300)) * time.Millisecond
		for _, b := range runAndKill(t, "TestKilledAppenderLosesNoAcknowledgedRecord", dir, nil, kill, delay) {
			acked[b.shard] = append(acked[b.shard], b)
		}
		bucket, err := localBucket(dir)
		if err != nil {
			t.Fatal(err)
		}
		verify(t, engine.Options{Dir: dir, Bucket: bucket}, acked, kill, &parts, false)
		bucket.Close()
	}
	if parts == 0 {
		t.Fatal("no shard was ever sealed: the kill points did not reach a seal")
	}
	t.Logf("%d kill points; the shards held %d parts at the reopens", *kills, parts)
}

// batch is one acknowledged append, as the child reports it.
type batch struct {
	shard string
	first uint64
	count int
	crc   uint32 // over the batch's records, each length-prefixed
	bytes int    // of the records
	// window is the last unshipped-bytes gauge the child reported before this
	// acknowledgement (Local mode), and report which report it was (0: none).
	window int64
	report int
}

// runAndKill runs test's child on dir, with env added, and kills it with SIGKILL
// delay after it is ready; it returns the batches the child acknowledged.
func runAndKill(t *testing.T, test, dir string, env []string, kill int, delay time.Duration) []batch {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), envCrashChild+"="+dir, fmt.Sprintf("L0_CRASH_GENERATION=%d", kill))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		batches []batch
		started = make(chan struct{})
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		window, reports := int64(0), 0
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" {
				once.Do(func() { close(started) })
				continue
			}
			if n, err := fmt.Sscanf(line, "window %d", &window); n == 1 && err == nil {
				reports++
				continue
			}
			b := batch{window: window, report: reports}
			if _, err := fmt.Sscanf(line, "ack %s %d %d %d %d", &b.shard, &b.first, &b.count, &b.crc, &b.bytes); err != nil {
				t.Errorf("child said %q: %v", line, err)
				continue
			}
			mu.Lock()
			batches = append(batches, b)
			mu.Unlock()
		}
		once.Do(func() { close(started) })
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("child did not start within 30s")
	}
	time.Sleep(delay)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done // every ack written before the kill has been read
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("kill %d: child ended on its own: %v", kill, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return batches
}

// verify opens an engine with opts, takes every shard over (waiting for the
// child's leases to run out), and checks every acknowledged batch; it adds the
// shards' parts to *parts. With handBack, it closes each shard cooperatively, so
// that the next child takes it back at once.
func verify(t *testing.T, opts engine.Options, acked map[string][]batch, kill int, parts *int, handBack bool) {
	t.Helper()
	ctx := context.Background()
	e, err := engine.Open(ctx, opts)
	if err != nil {
		t.Fatalf("kill %d: reopen: %v", kill, err)
	}
	defer e.Close()
	for s := range crashShards {
		shard := fmt.Sprintf("shard-%d", s)
		sh, err := e.OpenShard(ctx, shard, engine.WaitForLease())
		if err != nil {
			t.Fatal(err)
		}
		if handBack {
			defer func() {
				if err := sh.Close(ctx); err != nil {
					t.Errorf("kill %d: close %s: %v", kill, shard, err)
				}
			}()
		}
		var recs [][]byte
		for rec, err := range sh.Read(ctx, 0) {
			if err != nil {
				t.Fatalf("kill %d: read %s: %v", kill, shard, err)
			}
			if rec.Offset != uint64(len(recs)) {
				t.Fatalf("kill %d: %s: offset %d after %d records", kill, shard, rec.Offset, len(recs))
			}
			recs = append(recs, rec.Value)
		}
		*parts += len(sh.Manifest().Parts)
		if info := sh.Info(); info.Next != uint64(len(recs)) {
			t.Fatalf("kill %d: %s: next offset %d, %d records", kill, shard, info.Next, len(recs))
		}
		for _, b := range acked[shard] {
			if b.first+uint64(b.count) > uint64(len(recs)) {
				t.Fatalf("kill %d: %s: acknowledged batch at %d+%d lost (%d records survive)", kill, shard, b.first, b.count, len(recs))
			}
			if got := batchCRC(recs[b.first : b.first+uint64(b.count)]); got != b.crc {
				t.Fatalf("kill %d: %s: acknowledged batch at %d+%d reads back different bytes", kill, shard, b.first, b.count)
			}
		}
		// Exactly once and in order: each writer's sequence numbers rise by one.
		seen := map[string]uint64{}
		for off, r := range recs {
			writer, seq := parseRecord(t, r)
			if want, ok := seen[writer]; ok && seq != want+1 {
				t.Fatalf("kill %d: %s offset %d: writer %s seq %d after %d", kill, shard, off, writer, seq, want)
			}
			seen[writer] = seq
		}
	}
	if n := e.Metrics().StrandedRecords; n != 0 {
		t.Fatalf("kill %d: %d records counted stranded", kill, n)
	}
}

func batchCRC(recs [][]byte) uint32 {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, r := range recs {
		h.Write(binary.AppendUvarint(nil, uint64(len(r))))
		h.Write(r)
	}
	return h.Sum32()
}

// A record is "writer seq padding": writer names the process generation and goroutine.
func parseRecord(t *testing.T, r []byte) (string, uint64) {
	var writer string
	var seq uint64
	if _, err := fmt.Sscanf(string(r), "%s %d", &writer, &seq); err != nil {
		t.Fatalf("record %q: %v", r, err)
	}
	return writer, seq
}

// crashChild appends until it is killed, printing "ack shard first count crc" after
// each acknowledged batch. Records carry a writer name unique to this process, so
// each writer's sequence restarts at 0 in every generation.
func crashChild(dir string) {
	ctx := context.Background()
	bucket, err := childBucket(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: bucket:", err)
		os.Exit(2)
	}
	// Small seal triggers, so that kill points land in every step of a seal.
	opts := engine.Options{Dir: dir, Bucket: bucket, Seal: seal.Options{
		SizeBytes: 128 << 10, Budget: 256 << 10, Interval: 20 * time.Millisecond,
	}}
	if os.Getenv(envCrashLocal) != "" {
		opts.Durability = engine.Local
	}
	if os.Getenv(envCrashShortLease) != "" {
		opts.Lease, opts.RenewEvery = shortLease, shortRenew
	}
	e, err := engine.Open(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	gen := os.Getenv("L0_CRASH_GENERATION")
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	report := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		io.WriteString(w, line)
		w.Flush()
	}
	report("ready\n")
	if opts.Durability == engine.Local {
		// What a machine loss would lose, reported between the acknowledgements:
		// read under the lock the acknowledgements are printed under, so that an
		// append acknowledged after the reading is printed after it.
		go func() {
			for range time.Tick(2 * time.Millisecond) {
				mu.Lock()
				fmt.Fprintf(w, "window %d\n", e.Metrics().TailUnshippedBytes)
				w.Flush()
				mu.Unlock()
			}
		}()
	}
	var wg sync.WaitGroup
	for s := range crashShards {
		sh, err := e.OpenShard(ctx, fmt.Sprintf("shard-%d", s))
		if err != nil {
			fmt.Fprintln(os.Stderr, "child: open shard:", err)
			os.Exit(2)
		}
		for g := range crashWriters {
			wg.Go(func() {
				writer := fmt.Sprintf("g%s-w%d", gen, g)
				rng := rand.New(rand.NewPCG(uint64(s), uint64(g)))
				for seq := uint64(0); ; {
					n := 1 + rng.IntN(16)
					recs := make([][]byte, n)
					for i := range recs {
						pad := strings.Repeat("x", rng.IntN(2048))
						recs[i] = fmt.Appendf(nil, "%s %d %s", writer, seq, pad)
						seq++
					}
					first, err := sh.Append(ctx, recs...)
					if err != nil {
						fmt.Fprintln(os.Stderr, "child: append:", err)
						os.Exit(3)
					}
					size := 0
					for _, r := range recs {
						size += len(r)
					}
					report(fmt.Sprintf("ack %s %d %d %d %d\n", sh.ID(), first, n, batchCRC(recs), size))
				}
			})
		}
	}
	wg.Wait()
}

// childBucket is the crash child's bucket: a GCS bucket (endpoint|name in
// envCrashGCS), a local directory named by envCrashBucket, or the one in its Dir.
func childBucket(ctx context.Context, dir string) (*substrate.Bucket, error) {
	if spec := os.Getenv(envCrashGCS); spec != "" {
		endpoint, name, _ := strings.Cut(spec, "|")
		d, err := gcs.Open(ctx, gcs.Config{Bucket: name, Endpoint: endpoint, ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
		if err != nil {
			return nil, err
		}
		return substrate.New(d, substrate.Options{Name: "shared"})
	}
	bucketDir := filepath.Join(dir, "bucket")
	if d := os.Getenv(envCrashBucket); d != "" {
		bucketDir = d
	}
	d, err := local.New(bucketDir)
	if err != nil {
		return nil, err
	}
	return substrate.New(d, substrate.Options{Name: "local"})
}

// localBucket is the bucket of an engine directory in these tests: a local-directory
// substrate inside it, so a child and the parent that reopens after it share it.
func localBucket(dir string) (*substrate.Bucket, error) {
	d, err := local.New(filepath.Join(dir, "bucket"))
	if err != nil {
		return nil, err
	}
	return substrate.New(d, substrate.Options{Name: "local"})
}
