package substrate

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound reports that no object exists under the key, in a bucket that
	// exists.
	ErrNotFound = errors.New("substrate: object not found")
	// ErrBucketNotFound reports that the bucket itself does not exist (never created,
	// misnamed, or removed). It is never ErrNotFound: a missing bucket read as a
	// missing object would make a misconfigured store look like a store of new,
	// empty shards.
	ErrBucketNotFound = errors.New("substrate: bucket not found")
	// ErrPreconditionFailed reports that a conditional write lost: the key already
	// existed (put-if-absent) or no longer had the expected version (compare-and-swap).
	ErrPreconditionFailed = errors.New("substrate: precondition failed")
	// ErrClosed reports use of a Bucket after Close.
	ErrClosed = errors.New("substrate: closed")
	// ErrInvalidKey reports a key that no backend may store; see ValidateKey.
	ErrInvalidKey = errors.New("substrate: invalid key")
	// ErrInvalidRange reports a ranged read that starts at or past the end of the
	// object.
	ErrInvalidRange = errors.New("substrate: invalid range")
)

// KeyError says why a key was rejected. It unwraps to ErrInvalidKey.
type KeyError struct {
	Key    string
	Reason string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("substrate: invalid key %q: %s", e.Key, e.Reason)
}

func (e *KeyError) Unwrap() error { return ErrInvalidKey }
