package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/fault"
	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// readerAt reads shard id with r from offset from, without following, and returns
// what it yields, failing on an error.
func readerAt(t *testing.T, r *Reader, id string, from uint64) []shard.Record {
	t.Helper()
	var out []shard.Record
	for rec, err := range r.Read(context.Background(), id, from) {
		if err != nil {
			t.Fatalf("the reader, from %d: %v", from, err)
		}
		out = append(out, rec)
	}
	return out
}

// TestAReaderNeverReturnsARecordACooperativeCloseDrops: the Reader promises that
// a record it returns is in the shard's history whoever owns it next, and that one
// whose append returned ErrOutcomeUnknown is among them once its page was shipped
// ("every later owner keeps it").
//
// The interleaving, in Remote mode: A appends three records; then its tail puts
// fail for a while, and an append of a fourth record, at offset 3, gives up
// waiting for its shipment (ErrOutcomeUnknown); its page is durable in A's WAL.
// The store comes back, A's flusher puts the page, and a Reader returns the record
// at offset 3. A then closes the shard cooperatively (Shard.Close): the seal
// covers the WAL's pages only up to the acknowledged end (3), and the release
// drops the tail pointer (no backlog), so the page shipped at offset 3 is in no
// one's history. B opens the shard at next offset 3 and its next append takes
// offset 3 with other bytes: the record the Reader returned is gone, and a Reader
// following the shard across the move ends on its tripwire.
func TestAReaderNeverReturnsARecordACooperativeCloseDrops(t *testing.T) {
	ctx := context.Background()
	drv := mem.New()
	fa := fault.Wrap(drv, 1)
	eA := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fa), Seal: quietSealOptions(), Durability: Remote,
		Tail: TailOptions{Retry: 10 * time.Millisecond}})
	x := openShard(t, eA, "x")
	if _, err := x.Append(ctx, recs("acked", 3)...); err != nil {
		t.Fatal(err)
	}
	r := openReader(t, drv)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := readerFollow(rctx, r, "x", 0)
	collect(t, got, 0, 3, 10*time.Second)

	// The tail cannot be put: the append waits for its shipment and gives up.
	fa.SetRules(fault.Rule{Ops: []substrate.Op{substrate.OpPutIfAbsent}, Key: "^tail/", Err: fault.ErrInjected})
	actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := x.Append(actx, []byte("shipped-late"))
	acancel()
	if !errors.Is(err, shard.ErrOutcomeUnknown) {
		t.Fatalf("the append whose shipment timed out: %v, want ErrOutcomeUnknown", err)
	}
	// The store comes back: the flusher ships the page, and the Reader returns it.
	fa.SetRules()
	seen := collect(t, got, 3, 4, 10*time.Second)
	if string(seen[0].Value) != "shipped-late" {
		t.Fatalf("the reader returned %q at 3", seen[0].Value)
	}
	t.Logf("the reader returned %q at offset 3, whose append ended with ErrOutcomeUnknown", seen[0].Value)

	// A closes the shard cooperatively, and B opens it.
	if err := x.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eB := open(t, Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", fault.Wrap(drv, 2)), Seal: quietSealOptions(), Durability: Remote})
	xB := openShard(t, eB, "x")
	t.Logf("B opened x: %+v", xB.Info())
	off, err := xB.Append(ctx, []byte("B's record"))
	if err != nil {
		t.Fatal(err)
	}
	history := readAll(t, xB, 0)
	t.Logf("B's append went to offset %d; B's history: %q", off, history)
	if len(history) < 4 || string(history[3]) != "shipped-late" {
		var at3 []byte
		if len(history) > 3 {
			at3 = history[3]
		}
		t.Errorf("the reader returned %q at offset 3; the next owner's history holds %q there", "shipped-late", at3)
	}
	// The follower meets B's history and checks the last record it returned.
	select {
	case y := <-got:
		t.Logf("the following reader then yields: offset %d %q, %v", y.Offset, y.Value, y.err)
	case <-time.After(2 * time.Second):
		t.Log("the following reader yields nothing more within 2 s")
	}
}
