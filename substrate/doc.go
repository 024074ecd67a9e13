// Package substrate is l0's access to object stores: every part and every manifest
// goes through it.
//
// A backend implements the small [Driver] interface (see the mem, local, gcs and s3
// sub-packages). Callers use the portable [Bucket], which wraps a driver and gives
// every backend the same contract:
//
//   - Keys are validated before any backend is touched ([ValidateKey]): no "." or ".."
//     segment, no absolute path, no empty segment, no control character, valid UTF-8,
//     at most [MaxKeyLen] bytes and [MaxSegmentLen] bytes per segment.
//   - A missing object is [ErrNotFound], never empty bytes; a missing bucket is
//     [ErrBucketNotFound], never ErrNotFound; a failed condition is
//     [ErrPreconditionFailed]; use after Close is [ErrClosed].
//   - Conditional writes are first-class: [Bucket.PutIfAbsent] creates an object only
//     if the key is free and keeps the original bytes otherwise; [Bucket.CompareAndSwap]
//     replaces an object only while its [Version] is the one the caller read.
//   - A driver that can take an object as it is produced ([WriterDriver]; the local
//     directory) also serves [Bucket.NewWriter]: the bytes go straight where the
//     object will be, and become it, under the same conditions as a put, only at
//     [Writer.Commit]. [Bucket.Streams] says whether a bucket can.
//   - A range is clipped to the object's end, whatever its length.
//   - Lists are sorted by key (bytewise) and paginated by the last key seen; a page is
//     empty only at the end of the listing.
//   - Every operation is counted per substrate, operation and outcome, a read by how
//     its stream ended, and timed (a read to its first byte).
//
// The conformance suite in substratetest proves that each driver keeps this contract,
// and the fault package wraps any driver to inject errors, latency and ambiguous
// failures.
package substrate
