package substrate

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Op names an operation, as in the op label of the metrics and in fault rules.
type Op string

// The operations of a Bucket.
const (
	OpPut            Op = "put"
	OpPutIfAbsent    Op = "put_if_absent"
	OpCompareAndSwap Op = "compare_and_swap"
	OpGet            Op = "get"
	OpAttributes     Op = "attributes"
	OpList           Op = "list"
	OpDelete         Op = "delete"
)

// Ops lists every operation.
var Ops = [...]Op{OpPut, OpPutIfAbsent, OpCompareAndSwap, OpGet, OpAttributes, OpList, OpDelete}

// Outcome classifies how an operation ended, as in the outcome label of the metrics.
type Outcome string

// The outcomes of an operation. A put-if-absent that finds the key taken counts as
// precondition_failed although the Bucket reports it as created=false, not an error.
// A missing bucket counts as error. A read counts when its stream ends: a stream that
// fails or ends short of the range counts as error (or canceled).
const (
	OutcomeOK                 Outcome = "ok"
	OutcomeNotFound           Outcome = "not_found"
	OutcomePreconditionFailed Outcome = "precondition_failed"
	OutcomeCanceled           Outcome = "canceled"
	OutcomeError              Outcome = "error"
)

// Outcomes lists every outcome.
var Outcomes = [...]Outcome{OutcomeOK, OutcomeNotFound, OutcomePreconditionFailed, OutcomeCanceled, OutcomeError}

func outcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, ErrNotFound):
		return OutcomeNotFound
	case errors.Is(err, ErrPreconditionFailed):
		return OutcomePreconditionFailed
	case isContextErr(err):
		return OutcomeCanceled
	default:
		return OutcomeError
	}
}

// Stats is a snapshot of a Bucket's operation counts.
type Stats struct {
	Operations map[Op]map[Outcome]uint64
}

// Count returns how many op calls ended with outcome.
func (s Stats) Count(op Op, outcome Outcome) uint64 { return s.Operations[op][outcome] }

// Total returns how many op calls there were, whatever their outcome.
func (s Stats) Total(op Op) uint64 {
	var n uint64
	for _, c := range s.Operations[op] {
		n += c
	}
	return n
}

// metrics counts and times a Bucket's operations, in Prometheus when a Registerer is
// given and always in plain counters for Stats.
type metrics struct {
	ops      [len(Ops)][len(Outcomes)]atomic.Uint64
	counters [len(Ops)][len(Outcomes)]prometheus.Counter
	duration [len(Ops)]prometheus.Observer
}

func newMetrics(substrate string, reg prometheus.Registerer) (*metrics, error) {
	opsVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "l0_substrate_operations_total",
		Help: "Object-store operations by substrate, operation and outcome; a read counts by how its stream ended.",
	}, []string{"substrate", "op", "outcome"})
	durVec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "l0_substrate_operation_duration_seconds",
		Help:    "Latency of object-store operations by substrate and operation; a read is timed to its first byte.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14), // 100µs .. ~15s
	}, []string{"substrate", "op"})
	if reg != nil {
		// Several buckets (one per replica) share one registry: the first registers
		// the vectors, the others reuse them with their own substrate label.
		var err error
		if opsVec, err = registerOrExisting(reg, opsVec); err != nil {
			return nil, err
		}
		if durVec, err = registerOrExisting(reg, durVec); err != nil {
			return nil, err
		}
	}
	m := &metrics{}
	for i, op := range Ops {
		for j, outcome := range Outcomes {
			m.counters[i][j] = opsVec.WithLabelValues(substrate, string(op), string(outcome))
		}
		m.duration[i] = durVec.WithLabelValues(substrate, string(op))
	}
	return m, nil
}

func registerOrExisting[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// observe records an operation that ended when its driver call returned.
func (m *metrics) observe(op Op, start time.Time, err error) {
	m.latency(op, start)
	m.count(op, err)
}

// latency records the time since start: a whole operation, or a read's first byte.
func (m *metrics) latency(op Op, start time.Time) {
	m.duration[opIndex(op)].Observe(time.Since(start).Seconds())
}

// count records how an operation ended.
func (m *metrics) count(op Op, err error) {
	i := opIndex(op)
	j := outcomeIndex(outcomeOf(err))
	m.ops[i][j].Add(1)
	m.counters[i][j].Inc()
}

func (m *metrics) stats() Stats {
	s := Stats{Operations: make(map[Op]map[Outcome]uint64, len(Ops))}
	for i, op := range Ops {
		s.Operations[op] = make(map[Outcome]uint64, len(Outcomes))
		for j, outcome := range Outcomes {
			s.Operations[op][outcome] = m.ops[i][j].Load()
		}
	}
	return s
}

func opIndex(op Op) int {
	for i, o := range Ops {
		if o == op {
			return i
		}
	}
	panic("substrate: unknown op " + string(op))
}

func outcomeIndex(outcome Outcome) int {
	for i, o := range Outcomes {
		if o == outcome {
			return i
		}
	}
	panic("substrate: unknown outcome " + string(outcome))
}
