package sealer

import (
	"sync"
	"sync/atomic"

	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/seal"
)

// Counters count seals wherever they run: started by the scheduler, by a shard's
// Close, or called directly. A seal counts once, by what it did: a committed part
// is a seal even if the truncation after it failed; a seal that committed nothing
// and failed is a failure. Safe for concurrent use.
type Counters struct {
	seals, empty, failures, objects, bytes atomic.Uint64
}

// Observe counts one seal's outcome.
func (c *Counters) Observe(res seal.Result, err error) {
	switch {
	case res.Records > 0:
		c.seals.Add(1)
		c.objects.Add(uint64(res.Objects))
		c.bytes.Add(res.RawBytes)
	case err != nil:
		c.failures.Add(1)
	default:
		c.empty.Add(1)
	}
}

// Stats returns the counts.
func (c *Counters) Stats() Stats {
	return Stats{
		Seals: c.seals.Load(), EmptySeals: c.empty.Load(), Failures: c.failures.Load(),
		Objects: c.objects.Load(), SealedBytes: c.bytes.Load(),
	}
}

// Doubts are the parts of one shard whose commit ended with an unknown outcome
// (manifest.ErrUnknownOutcome): the part may be in the manifest. Each keeps its
// local file until the shard's next seal settles it: a part that turns out to be
// committed is a commit, with its copies to the other replicas; one that is not is
// an orphan object, and its file goes. Safe for concurrent use.
type Doubts struct {
	mu    sync.Mutex
	parts []Doubt
}

// Doubt is one part in doubt and its local file.
type Doubt struct {
	Part     manifest.Part
	File     string
	rawBytes uint64
}

func (d *Doubts) add(p manifest.Part, file string, rawBytes uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.parts = append(d.parts, Doubt{p, file, rawBytes})
}

// Take removes and returns every doubt.
func (d *Doubts) Take() []Doubt {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.parts
	d.parts = nil
	return out
}

// Len returns how many parts are in doubt.
func (d *Doubts) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.parts)
}
