package substrate

import (
	"strings"
	"unicode/utf8"
)

// Bounds on keys, the strictest of the backends: S3 and GCS allow 1024 bytes of UTF-8,
// and a local file name is at most 255 bytes, of which the local driver uses 2 to tell
// objects from directories.
const (
	MaxKeyLen     = 1024
	MaxSegmentLen = 250
)

// ValidateKey reports, as a *KeyError, why key cannot be stored on every backend, or
// nil. Keys are '/'-separated paths relative to the bucket.
func ValidateKey(key string) error {
	reject := func(reason string) error { return &KeyError{Key: key, Reason: reason} }
	switch {
	case key == "":
		return reject("empty")
	case len(key) > MaxKeyLen:
		return reject("longer than 1024 bytes")
	case !utf8.ValidString(key):
		return reject("not valid UTF-8")
	case key[0] == '/':
		return reject("absolute path")
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			return reject("control character")
		}
	}
	for seg := range strings.SplitSeq(key, "/") {
		switch {
		case seg == "":
			return reject("empty segment")
		case seg == "." || seg == "..":
			return reject("'.' or '..' segment")
		case len(seg) > MaxSegmentLen:
			return reject("segment longer than 250 bytes")
		}
	}
	return nil
}

// validatePrefix accepts "" (the whole bucket) and any prefix of a valid key, which may
// end in '/' or in a partial segment.
func validatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if err := ValidateKey(strings.TrimSuffix(prefix, "/")); err != nil {
		ke := err.(*KeyError)
		ke.Key = prefix
		return ke
	}
	return nil
}
