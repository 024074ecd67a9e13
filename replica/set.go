// Package replica is the replica set of an engine — ordered, named substrates, each
// in a failure domain — and the background uploader that copies sealed parts to the
// replicas that lack them, from a local file or from another replica (UploadSource).
//
// The first replica receives a part at seal; the uploader copies it to the others and
// reports each copy to the job's Recorder, the owner of the shard that queued it,
// which records the location in the shard's manifest. A job
// carries the part's seal time when it was sealed in this process; a backfill job
// (history sealed before a replica was attached, or before a restart) has none, and
// contributes no seal-to-durable lag sample.
package replica

import (
	"errors"
	"fmt"
	"slices"

	"github.com/l0store/l0/substrate"
)

// ErrInvalidSet reports a replica set that NewSet refuses.
var ErrInvalidSet = errors.New("replica: invalid set")

// Spec is one replica.
type Spec struct {
	// Name identifies the replica in manifests; unique in the set, and a valid key
	// segment.
	Name string
	// Domain is the replica's failure domain: replicas in one domain can be lost
	// together (one node, one zone, one provider region).
	Domain string
	Bucket *substrate.Bucket
}

// Set is an ordered, validated replica set.
type Set struct {
	specs     []Spec
	authority int
}

// NewSet validates specs and names the authority: the replica whose manifest copy
// fences owners. An empty authority means the first replica.
func NewSet(specs []Spec, authority string) (*Set, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: no replicas", ErrInvalidSet)
	}
	s := &Set{specs: append([]Spec(nil), specs...), authority: -1}
	seen := map[string]bool{}
	for i, sp := range s.specs {
		switch {
		case sp.Bucket == nil:
			return nil, fmt.Errorf("%w: replica %d (%q) has no bucket", ErrInvalidSet, i, sp.Name)
		case sp.Domain == "":
			return nil, fmt.Errorf("%w: replica %q has no failure domain", ErrInvalidSet, sp.Name)
		case seen[sp.Name]:
			return nil, fmt.Errorf("%w: replica name %q twice", ErrInvalidSet, sp.Name)
		}
		if err := substrate.ValidateKey(sp.Name); err != nil || len(sp.Name) > 64 {
			return nil, fmt.Errorf("%w: replica name %q", ErrInvalidSet, sp.Name)
		}
		seen[sp.Name] = true
		if sp.Name == authority || (authority == "" && i == 0) {
			s.authority = i
		}
	}
	if s.authority < 0 {
		return nil, fmt.Errorf("%w: authority %q is not in the set", ErrInvalidSet, authority)
	}
	return s, nil
}

// Len is the number of replicas.
func (s *Set) Len() int { return len(s.specs) }

// Specs returns the replicas in order.
func (s *Set) Specs() []Spec { return append([]Spec(nil), s.specs...) }

// Missing returns the replicas of the set, in order, that have does not name: those
// a part held by have is to be copied to.
func (s *Set) Missing(have []string) []string {
	var out []string
	for _, sp := range s.specs {
		if !slices.Contains(have, sp.Name) {
			out = append(out, sp.Name)
		}
	}
	return out
}

// First is the replica a seal writes to.
func (s *Set) First() Spec { return s.specs[0] }

// Authority is the replica whose manifest copy fences owners.
func (s *Set) Authority() Spec { return s.specs[s.authority] }

// Others returns every replica but the authority, in order: where manifest copies go.
func (s *Set) Others() []*substrate.Bucket {
	var out []*substrate.Bucket
	for i, sp := range s.specs {
		if i != s.authority {
			out = append(out, sp.Bucket)
		}
	}
	return out
}

// Get returns the replica named name.
func (s *Set) Get(name string) (Spec, bool) {
	for _, sp := range s.specs {
		if sp.Name == name {
			return sp, true
		}
	}
	return Spec{}, false
}

// Config is what the declared replica set promises: configuration, not data. Whether
// the parts are actually spread is Durability's to say.
type Config struct {
	Size            int
	DistinctDomains int
	// SinglePointOfFailure: one domain holds every replica.
	SinglePointOfFailure bool
}

// Config describes the set.
func (s *Set) Config() Config {
	domains := map[string]bool{}
	for _, sp := range s.specs {
		domains[sp.Domain] = true
	}
	return Config{Size: len(s.specs), DistinctDomains: len(domains), SinglePointOfFailure: len(domains) < 2}
}

// Durability is what the parts say about the data.
type Durability struct {
	Parts int
	// UnderReplicated parts lack a copy on some replica of the set.
	UnderReplicated int
	// Stuck are under-replicated parts with no upload queued: nothing will improve
	// them until a backfill.
	Stuck int
	// SurvivesDomainLoss is claimed from evidence only: at least one part is known
	// and every part has copies in at least two failure domains. With no part known
	// it is false (read it beside Parts), and so it is for a set of one domain, even
	// with every part on every replica: losing that domain loses them all.
	SurvivesDomainLoss bool
}

// Assess computes Durability from parts' replica names; queued reports whether an
// upload of a part is queued or running.
func (s *Set) Assess(parts []PartReplicas, queued func(key string) bool) Durability {
	d := Durability{Parts: len(parts), SurvivesDomainLoss: len(parts) > 0}
	for _, p := range parts {
		domains := map[string]bool{}
		held := 0
		for _, name := range p.Replicas {
			if sp, ok := s.Get(name); ok {
				domains[sp.Domain] = true
				held++
			}
		}
		if held < len(s.specs) {
			d.UnderReplicated++
			if queued == nil || !queued(p.Key) {
				d.Stuck++
			}
		}
		if len(domains) < 2 {
			d.SurvivesDomainLoss = false
		}
	}
	return d
}

// PartReplicas is a part's key and the replicas that hold it.
type PartReplicas struct {
	Key      string
	Replicas []string
}
