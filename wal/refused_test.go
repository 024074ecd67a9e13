package wal

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
)

// dirFiles returns every file of dir with its bytes.
func dirFiles(t *testing.T, fs vfs.FS, dir string) map[string][]byte {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string][]byte, len(names))
	for _, name := range names {
		b, err := fsutil.ReadFile(fs, fs.PathJoin(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out
}

// TestARefusedLogStaysAsFound: a log whose middle segment is lost holds acknowledged,
// unsealed records in the segments before the gap. The open refuses it, and must
// leave every file as it found it: the older segments are not leftovers of a crash
// to recycle or remove, and once the lost file is put back the log opens whole.
func TestARefusedLogStaysAsFound(t *testing.T) {
	ctx := context.Background()
	fs := vfs.NewMem()
	opts := Options{FS: fs, SegmentSize: 1 << 10, RecycleSegments: 1, AckedInterval: time.Hour}
	l := open(t, "wal", opts)
	big := []byte(strings.Repeat("x", 300))
	const n = 30
	for range n {
		if _, err := l.Append(ctx, "s", 0, [][]byte{big}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lost := segmentName(5)
	found := dirFiles(t, fs, "wal")
	if _, ok := found[lost]; !ok {
		t.Fatalf("no segment 5 to lose: %v", slices.Sorted(maps.Keys(found)))
	}
	kept := found[lost]
	if err := fs.Remove("wal/" + lost); err != nil {
		t.Fatal(err)
	}
	delete(found, lost)

	if l, err := Open("wal", opts); err == nil {
		l.Close()
		t.Fatal("a log missing a segment of unsealed records opened")
	}
	after := dirFiles(t, fs, "wal")
	for _, name := range slices.Sorted(maps.Keys(found)) {
		b := found[name]
		if got, ok := after[name]; !ok {
			t.Fatalf("%s is gone after the refused open\nfound: %v\nafter: %v", name, slices.Sorted(maps.Keys(found)), slices.Sorted(maps.Keys(after)))
		} else if !bytes.Equal(got, b) {
			t.Fatalf("%s changed in the refused open", name)
		}
	}
	for name := range after {
		if _, ok := found[name]; !ok {
			t.Fatalf("the refused open made %s", name)
		}
	}

	// The lost file comes back: the log opens with every record.
	f, err := fs.Create("wal/"+lost, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(kept); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	l = open(t, "wal", opts)
	defer l.Close()
	if got := len(readAll(t, l, "s", 0)); got != n {
		t.Fatalf("with the lost segment back the log reads %d records, %d were acknowledged", got, n)
	}
}
