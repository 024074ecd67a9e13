package shard

import "fmt"

// MaxIDLen is the longest shard id. Ids name WAL keys and object-store keys, so they
// are short and use only characters that are safe in both.
const MaxIDLen = 128

// ValidateID reports whether id is a valid shard id: 1 to 128 characters of
// [A-Za-z0-9._-], and neither "." nor "..". An invalid id is an error wrapping
// ErrInvalidID.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidID)
	case len(id) > MaxIDLen:
		return fmt.Errorf("%w: %d characters, more than %d", ErrInvalidID, len(id), MaxIDLen)
	case id == "." || id == "..":
		return fmt.Errorf("%w: %q", ErrInvalidID, id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !idChar(c) {
			return fmt.Errorf("%w: %q has %q at %d; allowed are A-Z a-z 0-9 . _ -", ErrInvalidID, id, c, i)
		}
	}
	return nil
}

func idChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}
