package substrate_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidateKey(t *testing.T) {
	valid := []string{"a", "shards/orders-7/parts/00000000000000000000-00000000000000000015", "dir with spaces/ünï 🚀",
		".hidden", "a/.b", "..a", "a..", strings.Repeat("s", substrate.MaxSegmentLen), strings.Repeat("k/", 511) + "k"}
	for _, k := range valid {
		if err := substrate.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", k, err)
		}
	}
	invalid := map[string]string{
		"":                              "empty",
		"/a":                            "absolute",
		"a//b":                          "empty segment",
		"a/":                            "empty segment",
		"..":                            "'..'",
		"a/../b":                        "'..'",
		"./a":                           "'.'",
		"a\x00":                         "control",
		"a\x7f":                         "control",
		"\xc3\x28":                      "UTF-8",
		strings.Repeat("k/", 512) + "k": "1024",
		strings.Repeat("s", substrate.MaxSegmentLen+1): "segment longer",
	}
	for k, reason := range invalid {
		err := substrate.ValidateKey(k)
		var ke *substrate.KeyError
		if !errors.As(err, &ke) || !errors.Is(err, substrate.ErrInvalidKey) || !strings.Contains(ke.Reason, reason) {
			t.Errorf("ValidateKey(%q) = %v, want a KeyError about %q", k, err, reason)
		}
	}
}

func TestEverySeriesExistsAtZeroAndTheRegistryLintsClean(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, name := range []string{"local", "gcs"} {
		b, err := substrate.New(mem.New(), substrate.Options{Name: name, Registerer: reg})
		if err != nil {
			t.Fatalf("bucket %s on a shared registry: %v", name, err)
		}
		defer b.Close()
	}
	wantCounters := 2 * len(substrate.Ops) * len(substrate.Outcomes)
	if n := testutil.CollectAndCount(reg, "l0_substrate_operations_total"); n != wantCounters {
		t.Fatalf("%d operation series before any operation, want %d", n, wantCounters)
	}
	if n := testutil.CollectAndCount(reg, "l0_substrate_operation_duration_seconds"); n != 2*len(substrate.Ops) {
		t.Fatalf("%d duration series, want %d", n, 2*len(substrate.Ops))
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func TestOperationsAreCountedByOutcome(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	b, err := substrate.New(mem.New(), substrate.Options{Name: "mem", Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := t.Context()
	b.PutBytes(ctx, "k", []byte("v"))
	b.PutIfAbsentBytes(ctx, "k", []byte("w")) // taken: precondition_failed
	b.Get(ctx, "missing")                     // not_found
	b.Get(ctx, "k")
	b.Get(ctx, "../bad") // rejected before the driver: not an operation

	for _, c := range []struct {
		op, outcome string
		want        float64
	}{
		{"put", "ok", 1}, {"put_if_absent", "precondition_failed", 1}, {"get", "not_found", 1}, {"get", "ok", 1}, {"get", "error", 0},
	} {
		if got := counterValue(t, reg, c.op, c.outcome); got != c.want {
			t.Errorf("%s/%s = %v, want %v", c.op, c.outcome, got, c.want)
		}
	}
	s := b.Stats()
	if s.Count(substrate.OpGet, substrate.OutcomeOK) != 1 || s.Total(substrate.OpGet) != 2 {
		t.Errorf("stats: get ok %d, total %d; want 1 and 2", s.Count(substrate.OpGet, substrate.OutcomeOK), s.Total(substrate.OpGet))
	}
}

// counterValue reads the series of l0_substrate_operations_total with the labels.
func counterValue(t *testing.T, reg *prometheus.Registry, op, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "l0_substrate_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == op && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series op=%s outcome=%s", op, outcome)
	return 0
}
