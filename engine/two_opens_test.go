package engine

import (
	"context"
	"testing"

	"github.com/l0store/l0/substrate/mem"
	"github.com/l0store/l0/substrate/substratetest"
)

// TestASecondOpenOfOneDirIsRefused: the WAL's lock is what tells an engine that the
// instance lease's earlier holder on its Dir is gone, so a second Open of a Dir in
// use must fail before it touches the lease.
func TestASecondOpenOfOneDirIsRefused(t *testing.T) {
	drv := mem.New()
	opts := Options{Dir: t.TempDir(), Bucket: substratetest.NewBucket(t, "shared", drv), Seal: quietSealOptions()}
	e1 := open(t, opts)
	defer e1.Close()
	e2, err := Open(context.Background(), opts)
	if err == nil {
		e2.Close()
		t.Fatal("a second engine opened the same Dir")
	}
	t.Logf("second open: %v", err)
}
