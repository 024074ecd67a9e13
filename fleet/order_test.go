package fleet

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/l0store/l0/shard"
	"github.com/l0store/l0/substrate/mem"
)

// A server hears of a shard opened before it hears of it revoked: a shard whose
// Opened has not returned is not drained yet, or the server could route to a
// shard it was already told to stop routing to.
func TestAShardIsAnnouncedOpenedBeforeRevoked(t *testing.T) {
	var mu sync.Mutex
	catalog := []Shard{{ID: "s00"}}
	var events []string
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	m, err := Join(t.Context(), memMachine(t, mem.New()), Options{
		Shards: func(context.Context) ([]Shard, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(catalog), nil
		},
		PollEvery: 10 * time.Millisecond, PublishEvery: 10 * time.Millisecond,
		Opened: func(id string, _ *shard.Shard) {
			record("opened " + id)
			// The shard leaves the catalog while the server is still taking it in.
			mu.Lock()
			catalog = nil
			mu.Unlock()
			time.Sleep(300 * time.Millisecond)
			record("opened returned " + id)
		},
		Revoked: func(id string) { record("revoked " + id) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Leave(context.Background()) })
	deadline := time.Now().Add(20 * time.Second) // liveness only
	for {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events after 20 s: %v", events)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"opened s00", "opened returned s00", "revoked s00"}; !slices.Equal(events[:3], want) {
		t.Fatalf("events %v, want %v", events, want)
	}
}
