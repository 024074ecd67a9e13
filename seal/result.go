package seal

import "github.com/l0store/l0/manifest"

// Result is what one seal did.
type Result struct {
	Records  uint64
	RawBytes uint64 // record bytes sealed
	Objects  int    // objects written
	Size     int64  // bytes of the objects
	// Cut reports that the budget left records unsealed.
	Cut bool
	// Committed are the parts the seal committed: its own, and the parts in doubt
	// it settled as committed (counted as seals of their own). It is set even
	// with an error, such as a truncation after the commit that failed.
	Committed []Committed
}

// Empty reports a seal that found nothing to seal.
func (r Result) Empty() bool { return r.Records == 0 }

// Committed is a part a seal committed, and its local file ("" for a part
// written straight into its bucket, which needs no local file when no other
// replica takes a copy of it). The file is the source of the part's copies to
// the other replicas, and goes once they end: a shard's seal queues those copies
// before it returns, so the file may be gone by the time its caller looks.
type Committed struct {
	Part manifest.Part
	File string
}
