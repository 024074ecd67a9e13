// Package replication is the engine's machinery over the replicas a user declares
// (replica.Spec): the validated, ordered Set — which replica a seal writes to, which
// one's manifest copy fences owners, which ones get the manifest's copies, in what
// order reads try them — and the background Uploader that copies sealed parts to
// the replicas that lack them, from a local file or from another replica (Source).
//
// It is named for both halves rather than for the uploader alone because the set
// serves the manifest store and the read path as much as the uploads; a user
// configures them through package replica and engine.Options, never here.
//
// The first replica receives a part at seal; the uploader copies it to the others and
// reports each copy to the job's Recorder, the owner of the shard that queued it,
// which records the location in the shard's manifest. A job carries the part's seal
// time when it was sealed in this process; a backfill job (history sealed before a
// replica was attached, or before a restart) has none, and contributes no
// seal-to-durable lag sample.
package replication
