package manifest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
)

// The manifest encoding. Changing any of these changes the durable format.
const (
	magic   = "l0man"
	version = 1
	// MaxSize bounds what a reader accepts; a manifest of a million parts is far
	// smaller.
	MaxSize = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorrupt reports a manifest that fails its checks.
	ErrCorrupt = errors.New("manifest: corrupt")
	// ErrUnknownVersion reports a manifest written by a newer format version.
	ErrUnknownVersion = errors.New("manifest: unknown format version")
	// ErrFenced reports a write by an owner whose epoch was moved on by another
	// instance, or whose lease lapsed: it must acknowledge nothing more.
	ErrFenced = errors.New("manifest: fenced")
	// ErrLeaseExpired reports an owner whose lease ran out unrenewed; it is also
	// ErrFenced.
	ErrLeaseExpired = fmt.Errorf("%w: lease expired", ErrFenced)
	// ErrOwned reports a shard whose lease another instance holds; errors wrapping it
	// are *OwnedError.
	ErrOwned = errors.New("manifest: owned by another instance")
	// ErrReleased reports use of an Owner after Release; it is also ErrFenced.
	ErrReleased = fmt.Errorf("%w: lease released", ErrFenced)
	// ErrUnknownPart reports a part the manifest does not name.
	ErrUnknownPart = errors.New("manifest: unknown part")
	// ErrConflict reports a commit that does not follow the manifest as published.
	ErrConflict = errors.New("manifest: commit does not follow the sealed watermark")
	// ErrUnknownOutcome reports a write that may or may not have reached the
	// authority: it failed, and reading the manifest back did not settle it. The
	// owner's next write settles it (the compare-and-swap fails if it landed, and
	// the owner reloads).
	ErrUnknownOutcome = errors.New("manifest: write outcome unknown")

	// ErrDiverged reports a replica whose manifest another owner wrote at the same
	// epoch: the shard had two authorities, and the copy leaves the replica as it is.
	ErrDiverged = errors.New("manifest: histories diverged")

	// ErrMoved reports a takeover whose manifest another write changed after it
	// was inspected.
	ErrMoved = errors.New("manifest: changed since inspected")

	// ErrClosed reports a wait for a copy that the Store's Close dropped.
	ErrClosed = errors.New("manifest: store closed")
)

// OwnedError says who holds a shard and until when.
type OwnedError struct {
	Shard, Owner string
	Expiry       time.Time
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("manifest: shard %q is owned by %q until %s", e.Shard, e.Owner, e.Expiry.Format(time.RFC3339Nano))
}

func (e *OwnedError) Unwrap() error { return ErrOwned }

// Manifest is the durable state of one shard.
type Manifest struct {
	Shard string `json:"shard"`
	// Epoch counts ownership takeovers; every open bumps it.
	Epoch uint64 `json:"epoch"`
	// Seq counts the manifest's publishes: each is one past the manifest it
	// replaced on the authority, whoever wrote it. Two different states of a shard
	// never share bytes (an S3 ETag, a content hash, cannot come back), and a copy
	// can tell an older manifest from a newer one.
	Seq uint64 `json:"seq"`
	// Authority names the replica whose copy fenced the publish: epochs and
	// sequences order manifests only among those of one authority. Fork, if set,
	// is where this authority's history took over from another's (a cold open
	// from a replica alone makes it an authority of its own): the other's
	// manifests up to that point are this one's past. Empty in manifests written
	// before authorities were recorded.
	Authority string `json:"authority,omitempty"`
	Fork      *Fork  `json:"fork,omitempty"`
	// Owner is the instance that took Epoch, and Lease the token of its instance
	// lease's acquisition (see internal/lease): the ownership lasts while that
	// lease does, or until it is Released. The owner stays named after a release,
	// so the next owner knows whose unsealed pages follow the sealed watermark.
	// LeaseExpiry is the shard's own lease in a manifest written before instance
	// leases (no Lease), by the owner's clock; zero in every other.
	Owner       string    `json:"owner,omitempty"`
	Lease       string    `json:"lease,omitempty"`
	LeaseExpiry time.Time `json:"lease_expiry,omitzero"`
	Released    bool      `json:"released,omitempty"`
	// Backlog says that the owner released the lease with records past the
	// sealed watermark left in its WAL (a lag move): only an open on its Dir
	// can seal them.
	Backlog bool `json:"backlog,omitempty"`
	// Sealed is the offset after the last sealed record: the next part starts there,
	// and the WAL holds nothing below it.
	Sealed uint64 `json:"sealed"`
	Parts  []Part `json:"parts"`
	// Tail points at the tail stream that holds the owner's records past Sealed,
	// for an owner on another machine to read; nil when no owner shipped one.
	Tail *Tail `json:"tail,omitempty"`
}

// Tail is where a shard's unsealed records are on the object store: in the tail of
// the owner's instance on the replica named Replica, from sequence From of its
// stream's incarnation Incarnation on, and through every later incarnation the
// instance's chain lists, in their sections of the shard under the manifest's
// epoch. Until, when not zero, is where the owner's records end, recorded as it
// released the lease — sequence Until of incarnation UntilIncarnation (zero: of
// Incarnation): a reader stops there, where otherwise it marks the shard taken
// in the chain and fences the live incarnation first.
type Tail struct {
	Replica          string `json:"replica"`
	Instance         string `json:"instance"`
	Incarnation      uint64 `json:"incarnation"`
	From             uint64 `json:"from"`
	Until            uint64 `json:"until,omitempty"`
	UntilIncarnation uint64 `json:"until_incarnation,omitempty"`
}

// Fork is the manifest of another authority's history that a takeover started
// from.
type Fork struct {
	Authority string `json:"authority"` // empty: a manifest that named none
	Epoch     uint64 `json:"epoch"`
	Seq       uint64 `json:"seq"`
}

// Descends reports whether m's history includes a: a is of m's authority (or of
// none recorded) and not newer, or of the authority m forked from, at or before
// the fork.
func (m Manifest) Descends(a Manifest) bool {
	switch {
	case m.Authority == "": // written before authorities were recorded
		return a.Authority == "" && !a.After(m)
	case a.Authority == m.Authority:
		return !a.After(m)
	case m.Fork != nil && m.Fork.Authority == a.Authority:
		// Of the history m took over from (a manifest that named no authority,
		// written before they were recorded, included): only up to the fork.
		return !a.After(Manifest{Epoch: m.Fork.Epoch, Seq: m.Fork.Seq})
	}
	return false
}

// After reports whether m comes after b in the shard's history: a later epoch,
// or a later write in the same one.
func (m Manifest) After(b Manifest) bool {
	if m.Epoch != b.Epoch {
		return m.Epoch > b.Epoch
	}
	return m.Seq > b.Seq
}

// Part is one sealed part.
type Part struct {
	// Key is the part's object key, the same on every substrate holding it.
	Key   string `json:"key"`
	First uint64 `json:"first"`
	Count uint64 `json:"count"`
	Size  int64  `json:"size"`
	// CRC is the part CRC from its footer.
	CRC      uint32    `json:"crc"`
	SealedAt time.Time `json:"sealed_at"`
	// Epoch is the owner epoch that sealed the part.
	Epoch uint64 `json:"epoch"`
	// Replicas names the substrates that hold the part.
	Replicas []string `json:"replicas"`
}

// Next is the offset after the part's last record.
func (p Part) Next() uint64 { return p.First + p.Count }

// Clone returns a deep copy.
func (m Manifest) Clone() Manifest {
	if m.Fork != nil {
		f := *m.Fork
		m.Fork = &f
	}
	if m.Tail != nil {
		t := *m.Tail
		m.Tail = &t
	}
	m.Parts = slices.Clone(m.Parts)
	for i := range m.Parts {
		m.Parts[i].Replicas = slices.Clone(m.Parts[i].Replicas)
	}
	return m
}

// Validate checks the invariants: parts in offset order without gaps, each
// non-empty, the last ending at the sealed watermark.
func (m Manifest) Validate() error {
	for i, p := range m.Parts {
		switch {
		case p.Key == "" || p.Count == 0:
			return fmt.Errorf("%w: shard %q part %d: key %q, %d records", ErrCorrupt, m.Shard, i, p.Key, p.Count)
		case p.Next() < p.First:
			return fmt.Errorf("%w: shard %q part %d: %d records from %d pass the largest offset", ErrCorrupt, m.Shard, i, p.Count, p.First)
		case i > 0 && p.First != m.Parts[i-1].Next():
			return fmt.Errorf("%w: shard %q part %d starts at %d, after %d", ErrCorrupt, m.Shard, i, p.First, m.Parts[i-1].Next())
		}
	}
	if n := len(m.Parts); n > 0 && m.Parts[n-1].Next() != m.Sealed {
		return fmt.Errorf("%w: shard %q: parts end at %d, sealed watermark %d", ErrCorrupt, m.Shard, m.Parts[n-1].Next(), m.Sealed)
	}
	return nil
}

// Encode returns the durable encoding of m.
func Encode(m Manifest) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	b := append([]byte(magic), version)
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// Decode parses and checks a durable manifest.
func Decode(b []byte) (Manifest, error) {
	if len(b) < len(magic)+1+4 || string(b[:len(magic)]) != magic {
		return Manifest{}, fmt.Errorf("%w: not a manifest", ErrCorrupt)
	}
	if len(b) > MaxSize {
		return Manifest{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[len(body):]) {
		return Manifest{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if v := b[len(magic)]; v != version {
		return Manifest{}, fmt.Errorf("%w: %d", ErrUnknownVersion, v)
	}
	var m Manifest
	if err := json.Unmarshal(body[len(magic)+1:], &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}
