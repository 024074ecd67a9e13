package substrate_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
)

// A read is counted by how it ended: the open succeeded, the stream did not.
func TestAReadThatBreaksOffIsCountedAsAnError(t *testing.T) {
	ctx := t.Context()
	fd := fault.Wrap(mem.New(), 1)
	b, err := substrate.New(fd, substrate.Options{Name: "faulty"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.PutBytes(ctx, "k", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	fd.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpGet}, Nth: 1, Err: fault.ErrInjected, ReadBreaksAfter: 3})
	if _, _, err := b.Get(ctx, "k"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("get that breaks off: err = %v, want the injected error", err)
	}
	if data, _, err := b.Get(ctx, "k"); err != nil || string(data) != "0123456789" {
		t.Fatalf("get after the break: %q, %v", data, err)
	}
	st := b.Stats()
	if ok, failed := st.Count(substrate.OpGet, substrate.OutcomeOK), st.Count(substrate.OpGet, substrate.OutcomeError); ok != 1 || failed != 1 {
		t.Fatalf("gets counted ok %d, error %d; want 1 and 1", ok, failed)
	}
}

// shortDriver serves objects whose stream ends after cut bytes, cleanly, while the
// reader reports the whole object's size: a driver that lost the end of a body.
type shortDriver struct {
	substrate.Driver
	cut int64
}

func (d shortDriver) NewRangeReader(ctx context.Context, key string, off, length int64) (substrate.DriverReader, error) {
	r, err := d.Driver.NewRangeReader(ctx, key, off, length)
	if err != nil {
		return nil, err
	}
	return shortReader{DriverReader: r, r: io.LimitReader(r, d.cut)}, nil
}

type shortReader struct {
	substrate.DriverReader
	r io.Reader
}

func (r shortReader) Read(p []byte) (int, error) { return r.r.Read(p) }

func TestAReadThatEndsShortIsAnError(t *testing.T) {
	ctx := t.Context()
	b, err := substrate.New(shortDriver{Driver: mem.New(), cut: 3}, substrate.Options{Name: "short"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.PutBytes(ctx, "k", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ off, length int64 }{{0, -1}, {2, 5}, {5, -1}} {
		data, _, err := b.GetRange(ctx, "k", tc.off, tc.length)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("range (%d, %d) cut after 3 bytes = %q, %v; want io.ErrUnexpectedEOF", tc.off, tc.length, data, err)
		}
	}
	// A range the cut does not reach is whole.
	if data, _, err := b.GetRange(ctx, "k", 7, 100); err != nil || string(data) != "789" {
		t.Errorf("range (7, 100) = %q, %v; want %q", data, err, "789")
	}
	st := b.Stats()
	if ok, failed := st.Count(substrate.OpGet, substrate.OutcomeOK), st.Count(substrate.OpGet, substrate.OutcomeError); ok != 1 || failed != 3 {
		t.Errorf("gets counted ok %d, error %d; want 1 and 3", ok, failed)
	}
}
