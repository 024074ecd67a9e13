package local_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/l0store/l0/substrate"
)

// A Writer open across its bucket's Close is refused as a Put would be: its
// writes and its commit fail with ErrClosed, its temporary file does not grow and
// goes, and nothing counts in the metrics.
func TestAWriterOpenAcrossCloseIsRefusedLikeAPut(t *testing.T) {
	dir := t.TempDir()
	b := newLocalBucket(t, dir)
	ctx := t.Context()
	w, err := b.NewWriter(ctx, "parts/a", substrate.Condition{IfAbsent: true})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := w.Write(make([]byte, 1<<20)); !errors.Is(err, substrate.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	temps, _ := os.ReadDir(filepath.Join(dir, "tmp"))
	for _, e := range temps {
		if info, err := e.Info(); err == nil && info.Size() > 20 { // the object file's header
			t.Errorf("the temporary file grew to %d bytes after Close", info.Size())
		}
	}
	if _, err := w.Commit(ctx); !errors.Is(err, substrate.ErrClosed) {
		t.Errorf("Commit after Close: %v", err)
	}
	if temps, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(temps) != 0 {
		t.Errorf("%d temporary files left after the refused commit", len(temps))
	}
	if _, _, err := b.PutIfAbsentBytes(ctx, "parts/b", []byte("x")); !errors.Is(err, substrate.ErrClosed) {
		t.Errorf("Put after Close: %v", err)
	}
	if n := b.Stats().Total(substrate.OpPutIfAbsent); n != 0 {
		t.Errorf("put-if-absent counted %d times for writes refused because the bucket was closed (a refused Put counts 0)", n)
	}
}
