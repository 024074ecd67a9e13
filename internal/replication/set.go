package replication

import (
	"errors"
	"fmt"
	"slices"

	"github.com/l0store/l0/replica"
	"github.com/l0store/l0/substrate"
)

// ErrInvalidSet reports a replica set that NewSet refuses.
var ErrInvalidSet = errors.New("replication: invalid replica set")

// Set is an ordered, validated replica set.
type Set struct {
	specs     []replica.Spec
	authority int
}

// NewSet validates specs and names the authority: the replica whose manifest copy
// fences owners. An empty authority means the first replica.
func NewSet(specs []replica.Spec, authority string) (*Set, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: no replicas", ErrInvalidSet)
	}
	s := &Set{specs: append([]replica.Spec(nil), specs...), authority: -1}
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
func (s *Set) Specs() []replica.Spec { return append([]replica.Spec(nil), s.specs...) }

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
func (s *Set) First() replica.Spec { return s.specs[0] }

// Authority is the replica whose manifest copy fences owners.
func (s *Set) Authority() replica.Spec { return s.specs[s.authority] }

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
func (s *Set) Get(name string) (replica.Spec, bool) {
	for _, sp := range s.specs {
		if sp.Name == name {
			return sp, true
		}
	}
	return replica.Spec{}, false
}

// Config describes the set.
func (s *Set) Config() replica.Config {
	domains := map[string]bool{}
	for _, sp := range s.specs {
		domains[sp.Domain] = true
	}
	return replica.Config{Size: len(s.specs), DistinctDomains: len(domains), SinglePointOfFailure: len(domains) < 2}
}

// Assess computes Durability from parts' replica names; queued reports whether an
// upload of a part is queued or running.
func (s *Set) Assess(parts []PartReplicas, queued func(key string) bool) replica.Durability {
	d := replica.Durability{Parts: len(parts), SurvivesDomainLoss: len(parts) > 0}
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
