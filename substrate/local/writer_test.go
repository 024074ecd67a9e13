package local_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/local"
)

// An object written as a stream is nothing under its key until Commit, is its bytes
// after it, and is not there at all if aborted or if its condition failed; no
// temporary file stays behind either way.
func TestAWriterIsAnObjectOnlyOnceCommitted(t *testing.T) {
	dir := t.TempDir()
	b := newLocalBucket(t, dir)
	defer b.Close()
	ctx := t.Context()
	if !b.Streams() {
		t.Fatal("a local bucket does not stream")
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB: past the writeback stride
	write := func(key string) *substrate.Writer {
		t.Helper()
		w, err := b.NewWriter(ctx, key, substrate.Condition{IfAbsent: true})
		if err != nil {
			t.Fatal(err)
		}
		for rest := body; len(rest) > 0; rest = rest[min(len(rest), 100_000):] {
			if _, err := w.Write(rest[:min(len(rest), 100_000)]); err != nil {
				t.Fatal(err)
			}
		}
		return w
	}
	temps := func() int {
		t.Helper()
		left, err := os.ReadDir(filepath.Join(dir, "tmp"))
		if err != nil {
			t.Fatal(err)
		}
		return len(left)
	}

	w := write("parts/a")
	if _, err := b.Attributes(ctx, "parts/a"); !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("an object before its commit: %v", err)
	}
	attrs, err := w.Commit(ctx)
	if err != nil || attrs.Size != int64(len(body)) {
		t.Fatalf("commit: %+v %v", attrs, err)
	}
	if got, _, err := b.Get(ctx, "parts/a"); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}

	w = write("parts/b")
	w.Abort()
	if _, err := b.Attributes(ctx, "parts/b"); !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("an aborted object: %v", err)
	}
	if _, err := w.Commit(ctx); !errors.Is(err, substrate.ErrClosed) {
		t.Fatalf("a commit after the abort: %v", err)
	}

	if _, err := write("parts/a").Commit(ctx); !errors.Is(err, substrate.ErrPreconditionFailed) {
		t.Fatalf("a second object under a key written if absent: %v", err)
	}
	if got, _, err := b.Get(ctx, "parts/a"); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("the first object after the second failed: %d bytes, %v", len(got), err)
	}
	if n := temps(); n != 0 {
		t.Fatalf("%d temporary files left", n)
	}
	if st := b.Stats(); st.Count(substrate.OpPutIfAbsent, substrate.OutcomeOK) != 1 || st.Count(substrate.OpPutIfAbsent, substrate.OutcomePreconditionFailed) != 1 || st.Total(substrate.OpPutIfAbsent) != 2 {
		t.Fatalf("put-if-absent counted %v, want 1 ok (the commit) and 1 precondition failed, the abort not at all", st.Operations[substrate.OpPutIfAbsent])
	}
}

// newLocalBucket opens a local-directory bucket at dir.
func newLocalBucket(t *testing.T, dir string) *substrate.Bucket {
	t.Helper()
	d, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := substrate.New(d, substrate.Options{Name: "local"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
