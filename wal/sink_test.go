package wal

import (
	"context"
	"slices"
	"sync"
)

// testSink is a Sink that keeps what it takes in memory: its shipments are done
// at once, or, while held, once released.
type testSink struct {
	mu    sync.Mutex
	held  chan struct{} // nil: shipped at once
	pages []takenPage
}

type takenPage struct {
	shard        string
	epoch, first uint64
	recs         [][]byte
}

type testShipment struct{ done <-chan struct{} }

func (s testShipment) Wait(ctx context.Context) error {
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var shippedNow = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (s *testSink) Take(shard string, epoch, first uint64, recs [][]byte) Shipment {
	cp := make([][]byte, len(recs))
	for i, r := range recs {
		cp[i] = slices.Clone(r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pages = append(s.pages, takenPage{shard, epoch, first, cp})
	if s.held != nil {
		return testShipment{s.held}
	}
	return testShipment{shippedNow}
}

func (s *testSink) Room(context.Context) error { return nil }

func (s *testSink) Gather() func() { return func() {} }

// hold keeps the shipments taken from now on from being done until release.
func (s *testSink) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = make(chan struct{})
	}
}

func (s *testSink) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != nil {
		close(s.held)
		s.held = nil
	}
}
