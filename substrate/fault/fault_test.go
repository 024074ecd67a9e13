package fault_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Without rules the wrapper must be invisible, also to the errors of a missing bucket,
// which a local driver whose root was removed gives (a mem driver cannot be missing).
func TestConformanceWithoutRules(t *testing.T) {
	substratetest.RunConformance(t, substratetest.Config{
		NewDriver: func(t testing.TB) substrate.Driver { return fault.Wrap(mem.New(), 1) },
		MissingBucket: func(t testing.TB) substrate.Driver {
			dir := t.TempDir()
			d, err := local.New(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			return fault.Wrap(d, 1)
		},
	})
}

func newBucket(t *testing.T, rules ...fault.Rule) (*substrate.Bucket, *fault.Driver) {
	t.Helper()
	fd := fault.Wrap(mem.New(), 42, rules...)
	b, err := substrate.New(fd, substrate.Options{Name: "faulty"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, fd
}

func put(b *substrate.Bucket, key string) error {
	_, err := b.PutBytes(context.Background(), key, []byte("v"))
	return err
}

func TestTheNthCallFailsAndOnlyIt(t *testing.T) {
	b, fd := newBucket(t, fault.Rule{Nth: 3, Err: fault.ErrInjected})
	for i := 1; i <= 5; i++ {
		err := put(b, "k")
		if (i == 3) != errors.Is(err, fault.ErrInjected) {
			t.Fatalf("call %d: err = %v", i, err)
		}
	}
	if fd.Calls() != 5 || fd.Injected() != 1 {
		t.Fatalf("calls %d injected %d, want 5 and 1", fd.Calls(), fd.Injected())
	}
	if got := b.Stats().Count(substrate.OpPut, substrate.OutcomeError); got != 1 {
		t.Fatalf("the bucket counted %d put errors, want 1", got)
	}
}

func TestRulesSelectByOperationAndKey(t *testing.T) {
	b, _ := newBucket(t,
		fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Err: fault.ErrInjected},
		fault.Rule{Ops: []substrate.Op{substrate.OpPut}, Key: `^parts/`, Err: substrate.ErrPreconditionFailed})
	ctx := t.Context()
	if err := put(b, "manifest"); err != nil {
		t.Fatalf("put outside the key pattern: %v", err)
	}
	if err := put(b, "parts/p1"); !errors.Is(err, substrate.ErrPreconditionFailed) {
		t.Fatalf("put inside the key pattern: err = %v, want the rule's error", err)
	}
	if _, _, err := b.PutIfAbsentBytes(ctx, "manifest-2", []byte("x")); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("put-if-absent: err = %v, want ErrInjected", err)
	}
	if _, _, err := b.Get(ctx, "manifest"); err != nil {
		t.Fatalf("get is not selected by any rule: %v", err)
	}
}

func TestProbabilityIsReplayableFromTheSeed(t *testing.T) {
	pattern := func(seed uint64) []bool {
		fd := fault.Wrap(mem.New(), seed, fault.Rule{Probability: 0.3, Err: fault.ErrInjected})
		var out []bool
		for range 1000 {
			_, err := fd.Put(t.Context(), "k", bytes.NewReader(nil), substrate.Condition{})
			out = append(out, err != nil)
		}
		return out
	}
	a, b, c := pattern(7), pattern(7), pattern(8)
	fails := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("call %d differs between two runs with one seed", i)
		}
		if a[i] {
			fails++
		}
	}
	if fails < 230 || fails > 370 {
		t.Fatalf("%d of 1000 calls failed at probability 0.3", fails)
	}
	if slicesEqual(a, c) {
		t.Fatal("two seeds gave the same failures")
	}
}

func slicesEqual(a, b []bool) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAnAmbiguousWriteTakesEffectAndReportsAnError(t *testing.T) {
	b, _ := newBucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Nth: 1, Err: fault.ErrInjected, Ambiguous: true})
	ctx := t.Context()
	_, created, err := b.PutIfAbsentBytes(ctx, "part", []byte("sealed"))
	if !errors.Is(err, fault.ErrInjected) || created {
		t.Fatalf("ambiguous put-if-absent: created %v, err %v; want an injected error", created, err)
	}
	data, _, err := b.Get(ctx, "part")
	if err != nil || string(data) != "sealed" {
		t.Fatalf("after the ambiguous write: %q, %v; want the bytes written", data, err)
	}
	// The retry a caller makes sees its own write as someone else's.
	_, created, err = b.PutIfAbsentBytes(ctx, "part", []byte("sealed"))
	if err != nil || created {
		t.Fatalf("retry: created %v, err %v; want false, nil", created, err)
	}
}

func TestLatencyIsAddedAndHonoursTheContext(t *testing.T) {
	b, _ := newBucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Latency: 50 * time.Millisecond})
	if err := put(b, "k"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, _, err := b.Get(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("get took %v, want at least the 50ms of latency", d)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	if _, _, err := b.Get(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get under a 5ms deadline: err = %v, want the deadline", err)
	}
}

func TestAReadCanBreakOffPartWay(t *testing.T) {
	b, _ := newBucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Err: fault.ErrInjected, ReadBreaksAfter: 10})
	if _, err := b.PutBytes(t.Context(), "k", bytes.Repeat([]byte("x"), 100)); err != nil {
		t.Fatal(err)
	}
	r, err := b.NewRangeReader(t.Context(), "k", 0, -1)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if len(got) != 10 || !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("read %d bytes, err %v; want 10 bytes and the injected error", len(got), err)
	}
}

// A Last rule's fired call is the driver's last: every call after it fails,
// whatever it is, until SetRules.
func TestALastRuleFailsEveryCallAfterIt(t *testing.T) {
	b, d := newBucket(t, fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^b$", Nth: 1, Err: fault.ErrInjected, Ambiguous: true, Last: true})
	ctx := t.Context()
	if _, _, err := b.PutIfAbsentBytes(ctx, "a", []byte("before")); err != nil {
		t.Fatalf("a call before the last one: %v", err)
	}
	if _, _, err := b.PutIfAbsentBytes(ctx, "b", []byte("last")); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("the last call: %v; want the injected error", err)
	}
	for _, key := range []string{"a", "b", "c"} {
		if _, _, err := b.Get(ctx, key); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("get %s after the last call: %v; want the injected error", key, err)
		}
	}
	d.SetRules()
	if data, _, err := b.Get(ctx, "b"); err != nil || string(data) != "last" {
		t.Fatalf("after SetRules: %q, %v; want the last call's write, landed", data, err)
	}
}
