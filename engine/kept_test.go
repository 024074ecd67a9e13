package engine

import (
	"context"
	"fmt"
	"testing"
)

// shard.Read says "Values are the caller's to keep". A caller that appends to a
// value it was given (here, a note of who processed it) must neither change the
// values it kept nor make the read fail, though the WAL reads pages in runs.
const note = " -- processed by worker-0123456789 at 2026-12-02T04:20:20.123456789Z\n"

func TestAReadersAppendToAValueItKeepsTouchesNoOtherValue(t *testing.T) {
	e := open(t, Options{Dir: t.TempDir()})
	sh := openShard(t, e, "orders")
	ctx := context.Background()
	for i := range 5 {
		if _, err := sh.Append(ctx, fmt.Appendf(nil, "order-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	var lines [][]byte
	for rec, err := range sh.Read(ctx, 0) {
		if err != nil {
			t.Fatalf("read after %d records, each given a note: %v", len(lines), err)
		}
		lines = append(lines, append(rec.Value, note...))
	}
	for i, l := range lines {
		if want := fmt.Sprintf("order-%d%s", i, note); string(l) != want {
			t.Fatalf("line %d is %q, want %q", i, l, want)
		}
	}
}
