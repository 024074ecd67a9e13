package manifest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/mem"
)

// An owner moves its shard's tail pointer twice in quick succession (a stream
// fenced, then the next one fenced too): the first write is sent and stays on the
// wire, its caller gives up; the second is made; the first lands late, before or
// after the second. Whatever the order the writes land in, the authority's pointer
// never goes back to the first stream once it named the second, and ends at the
// second: a late write lands only on the version it was sent for, which the next
// write replaces, and the owner serializes its own writes.
func TestALateTailPointerWriteNeverMovesThePointerBack(t *testing.T) {
	for _, late := range []string{"before the second write", "after the second write"} {
		t.Run(late, func(t *testing.T) {
			ctx := context.Background()
			d := &slowDriver{Driver: mem.New()}
			st := NewStore(bucket(t, "a", d))
			t.Cleanup(st.Close)
			o := acquire(t, st)
			t.Cleanup(func() { o.Release(context.Background()) })
			if err := o.PointTail(ctx, Tail{Replica: "a", Instance: "A", Incarnation: 1}); err != nil {
				t.Fatal(err)
			}

			// Every pointer the authority holds, in order, until the test ends.
			var (
				mu   sync.Mutex
				seen []uint64
			)
			stop := make(chan struct{})
			watched := make(chan struct{})
			go func() {
				defer close(watched)
				for {
					if m, _, err := st.Load(ctx, "s"); err == nil && m.Tail != nil {
						mu.Lock()
						if len(seen) == 0 || seen[len(seen)-1] != m.Tail.Incarnation {
							seen = append(seen, m.Tail.Incarnation)
						}
						mu.Unlock()
					}
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()

			// The move to incarnation 2: its write goes on the wire, its caller
			// gives up.
			d.arm(`^shards/s/manifest$`)
			wctx, cancel := context.WithCancel(ctx)
			first := make(chan error, 1)
			go func() { first <- o.PointTail(wctx, Tail{Replica: "a", Instance: "A", Incarnation: 2}) }()
			<-d.arrived
			cancel()
			if err := <-first; err == nil {
				t.Fatal("a pointer write whose caller gave up with it on the wire succeeded")
			}

			switch late {
			case "before the second write":
				d.land(t)
				if err := o.PointTail(ctx, Tail{Replica: "a", Instance: "A", Incarnation: 3}); err != nil {
					t.Fatalf("the move to incarnation 3 after the late write landed: %v", err)
				}
			case "after the second write":
				if err := o.PointTail(ctx, Tail{Replica: "a", Instance: "A", Incarnation: 3}); err != nil {
					t.Fatalf("the move to incarnation 3: %v", err)
				}
				// The late write was sent for a version the second replaced.
				d.mu.Lock()
				p := d.pending
				d.pending = nil
				d.mu.Unlock()
				if err := p(); !errors.Is(err, substrate.ErrPreconditionFailed) {
					t.Fatalf("the late write, sent for a version the second write replaced: %v, want a precondition failure", err)
				}
			}
			time.Sleep(20 * time.Millisecond) // the watcher reads what is there now
			close(stop)
			<-watched

			m, _, err := st.Load(ctx, "s")
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if m.Tail == nil || m.Tail.Incarnation != 3 {
				t.Fatalf("the pointer ends at %+v after the moves to 2 and 3 (seen %v)", m.Tail, seen)
			}
			for i := 1; i < len(seen); i++ {
				if seen[i] < seen[i-1] {
					t.Fatalf("the pointer moved back: incarnations in the order the authority held them %v", seen)
				}
			}
			if o.Manifest().Tail.Incarnation != 3 {
				t.Fatalf("the owner's view points at %d, the authority at 3", o.Manifest().Tail.Incarnation)
			}
		})
	}
}
