package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/l0store/l0/internal/part"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

type verifyFlags struct {
	jobs  int
	parts bool
}

var verifyCommand = &command{
	name: "verify", args: "[SHARD...]", summary: "check the shards' parts, manifests and tails; exit 1 on any damage",
	help: `Checks the named shards, or every stored shard, and prints each finding; the
exit status is 1 if any is damage, 0 for a healthy store. It checks:

  - every part's copy on every replica its manifest lists: there, of the size the
    manifest says, and read whole through the part reader, which checks every
    checksum (footer, index, blocks, the part CRC); its shard, offsets, record
    count and CRC are the manifest's;
  - every manifest's chain of parts, on the authority and on each copy: from offset
    0 to the sealed watermark without a gap or an overlap, keys of the part key
    form naming the part's offsets and epoch, no part of an epoch above the
    manifest's, each held by some replica;
  - the copies of each manifest: none diverged from the authority's, ahead of it,
    or unreadable (a copy behind is a copy in progress: noted, not damage);
  - the tail each manifest points at: every object it still needs is there, and
    the records past the sealed watermark read back contiguous, as a takeover
    reads them (nothing is fenced or marked);
  - with no SHARD, that every instance lease decodes.

Parts a replica lacks that the manifest does not say it holds are noted
(under-replicated: backfill copies them), and so are replicas the manifests name
that were not given. A store in use may show a finding that a second run does not
(a publish between two reads).
`,
	flags: func(fs *flag.FlagSet) any {
		f := &verifyFlags{}
		fs.IntVar(&f.jobs, "j", 4, "part copies read at once")
		fs.BoolVar(&f.parts, "parts", true, "read every part copy (false: check the manifests and tails only)")
		return f
	},
	run: runVerify, max: -1,
}

// report collects one shard's findings.
type report struct {
	damage, notes []string
}

func (r *report) damaged(format string, args ...any) {
	r.damage = append(r.damage, fmt.Sprintf(format, args...))
}
func (r *report) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func runVerify(c *call) error {
	f := c.flags.(*verifyFlags)
	if f.jobs < 1 {
		return usageErrorf("-j %d: want 1 or more", f.jobs)
	}
	ids, err := c.shardArgs()
	if err != nil {
		return err
	}
	var shardsDamaged, copies int
	for _, id := range ids {
		r, n := verifyShard(c.ctx, c.store, id, f)
		copies += n
		if err := c.ctx.Err(); err != nil {
			return err
		}
		for _, d := range r.damage {
			fmt.Fprintf(c.stdout, "%s: DAMAGE: %s\n", id, d)
		}
		for _, n := range r.notes {
			fmt.Fprintf(c.stdout, "%s: note: %s\n", id, n)
		}
		if len(r.damage) > 0 {
			shardsDamaged++
		} else {
			fmt.Fprintf(c.stdout, "%s: ok\n", id)
		}
	}
	leasesDamaged := 0
	if len(c.args) == 0 {
		l, err := readLeases(c.ctx, c.store.Authority().Bucket)
		if err != nil {
			return err
		}
		for _, key := range l.corrupt {
			fmt.Fprintf(c.stdout, "%s: DAMAGE: the instance lease does not decode\n", key)
		}
		leasesDamaged = len(l.corrupt)
	}
	fmt.Fprintf(c.stdout, "verified %d shards (%d part copies read): ", len(ids), copies)
	if shardsDamaged+leasesDamaged == 0 {
		fmt.Fprintln(c.stdout, "no damage")
		return nil
	}
	c.damaged = true
	fmt.Fprintf(c.stdout, "%d damaged", shardsDamaged)
	if leasesDamaged > 0 {
		fmt.Fprintf(c.stdout, ", %d instance leases corrupt", leasesDamaged)
	}
	fmt.Fprintln(c.stdout)
	return nil
}

// verifyShard checks one shard and returns its findings and how many part
// copies it read.
func verifyShard(ctx context.Context, s *store, id string, f *verifyFlags) (report, int) {
	var r report
	auth, copies := loadManifests(ctx, s, id)
	switch {
	case auth.Err != nil:
		r.damaged("the manifest on the authority %s: %v", auth.Replica, auth.Err)
	case auth.Raw == nil:
		r.damaged("no manifest on the authority %s", auth.Replica)
	default:
		checkChain(&r, auth)
	}
	for _, mc := range copies {
		switch {
		case mc.State.damaged():
			r.damaged("the manifest on %s is %s: %s", mc.Replica, mc.State, mc.Why)
		case mc.State == stateAbsent || mc.State == stateBehind || mc.State == stateStale || mc.State == stateUncompared:
			r.note("the manifest on %s is %s (%s)", mc.Replica, mc.State, mc.Why)
		}
		if mc.Present() && mc.State != stateSame {
			checkChain(&r, mc)
		}
	}
	if !auth.Present() {
		return r, 0
	}
	m := auth.M
	n := 0
	if f.parts {
		n = checkParts(ctx, s, &r, m, f.jobs)
	}
	checkCopies(s, &r, m)
	t := readTail(ctx, s, m)
	for _, d := range t.Damage {
		r.damaged("tail: %s", d)
	}
	for _, note := range t.Notes {
		r.note("tail: %s", note)
	}
	return r, n
}

// checkChain checks a manifest's parts: from offset 0 to the sealed watermark
// without a gap or an overlap, keys that name the parts' offsets and epochs, no
// epoch above the manifest's, and a replica for each. The manifest's decoder
// refuses a gap or an overlap between parts already; not one before the first.
func checkChain(r *report, mc manifestCopy) {
	m := mc.M
	on := "on " + mc.Replica
	next := uint64(0)
	keys := map[string]bool{}
	for i, p := range m.Parts {
		where := fmt.Sprintf("the manifest %s: part %d (%d to %d)", on, i, p.First, p.Next())
		switch {
		case p.First > next && i == 0:
			r.damaged("the manifest %s: its first part starts at %d: offsets 0 to %d are in no part", on, p.First, p.First-1)
		case p.First > next:
			r.damaged("%s: a gap: offsets %d to %d are in no part", where, next, p.First-1)
		case p.First < next:
			r.damaged("%s: overlaps the part before it, which ends at %d", where, next)
		}
		if p.Count == 0 {
			r.damaged("%s: holds no record", where)
		}
		prefix := manifest.PartKey(m.Shard, p.First, p.Next(), p.Epoch, "")
		if epoch, ok := manifest.PartKeyEpoch(m.Shard, p.Key); !ok || epoch != p.Epoch || !strings.HasPrefix(p.Key, prefix) {
			r.damaged("%s: its key %q does not name its offsets and epoch %d", where, p.Key, p.Epoch)
		}
		if keys[p.Key] {
			r.damaged("%s: its key %q is another part's too", where, p.Key)
		}
		keys[p.Key] = true
		if p.Epoch > m.Epoch {
			r.damaged("%s: sealed at epoch %d, above the manifest's %d", where, p.Epoch, m.Epoch)
		}
		if len(p.Replicas) == 0 {
			r.damaged("%s: no replica holds it", where)
		}
		next = p.Next()
	}
	if next != m.Sealed {
		r.damaged("the manifest %s: its parts end at %d, its sealed watermark is %d", on, next, m.Sealed)
	}
}

// checkCopies notes the parts a replica given lacks (their manifest does not name
// it) and the replicas the manifest names that were not given.
func checkCopies(s *store, r *report, m manifest.Manifest) {
	short := map[string]int{}
	unknown := map[string]int{}
	for _, p := range m.Parts {
		for _, name := range s.Names() {
			if !slices.Contains(p.Replicas, name) {
				short[name]++
			}
		}
		for _, name := range p.Replicas {
			if _, ok := s.Get(name); !ok {
				unknown[name]++
			}
		}
	}
	for _, name := range s.Names() {
		if n := short[name]; n > 0 {
			r.note("%d of %d parts are not on %s (under-replicated: l0ctl backfill copies them)", n, len(m.Parts), name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(unknown)) {
		r.note("%d parts are on replica %s, which was not given: those copies are unchecked", unknown[name], name)
	}
}

// checkParts reads every part copy the manifest lists on a replica given, jobs at
// a time, and reports the damaged ones in the manifest's order. It returns how
// many copies it read.
func checkParts(ctx context.Context, s *store, r *report, m manifest.Manifest, jobs int) int {
	type job struct {
		p   manifest.Part
		rep storeReplica
	}
	var todo []job
	for _, p := range m.Parts {
		for _, name := range p.Replicas {
			if rep, ok := s.Get(name); ok {
				todo = append(todo, job{p, rep})
			}
		}
	}
	errs := make([]error, len(todo))
	sem := make(chan struct{}, jobs)
	var wg sync.WaitGroup
	for i, j := range todo {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = verifyPart(ctx, j.rep.Bucket, m.Shard, j.p)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			p := todo[i].p
			r.damaged("part %d to %d on %s: %v", p.First, p.Next(), todo[i].rep.Name, err)
		}
	}
	return len(todo)
}

// verifyPart reads the part p of shard id from b whole, through the part reader,
// which checks every checksum, and checks what its index and footer say against
// the manifest.
func verifyPart(ctx context.Context, b *substrate.Bucket, id string, p manifest.Part) error {
	attrs, err := b.Attributes(ctx, p.Key)
	if errors.Is(err, substrate.ErrNotFound) {
		return fmt.Errorf("missing: %s is not there", p.Key)
	}
	if err != nil {
		return err
	}
	if attrs.Size != p.Size {
		return fmt.Errorf("%s: %d bytes, the manifest says %d", p.Key, attrs.Size, p.Size)
	}
	pr, err := part.Open(&objectReader{ctx: ctx, b: b, key: p.Key, size: attrs.Size}, attrs.Size, p.Key, nil)
	if err != nil {
		return err
	}
	info := pr.Info()
	switch {
	case info.Shard != id:
		return fmt.Errorf("%s: a part of shard %q", p.Key, info.Shard)
	case info.First != p.First || info.Count != p.Count:
		return fmt.Errorf("%s: holds %d records from %d, the manifest says %d from %d", p.Key, info.Count, info.First, p.Count, p.First)
	case info.CRC != p.CRC:
		return fmt.Errorf("%s: part CRC %08x, the manifest says %08x", p.Key, info.CRC, p.CRC)
	}
	return pr.Verify()
}

// readChunk is how much of an object objectReader fetches at once: a part is read
// front to back in a few ranged reads, in bounded memory, where reading it
// block by block would be a request per 64 KiB.
const readChunk = 8 << 20

// objectReader reads an object through ranged reads of readChunk bytes, keeping
// the last one. It is for one reader at a time.
type objectReader struct {
	ctx  context.Context
	b    *substrate.Bucket
	key  string
	size int64
	buf  []byte
	off  int64 // of buf in the object
}

func (r *objectReader) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		pos := off + int64(n)
		if pos >= r.size {
			return n, io.EOF
		}
		if pos < r.off || pos >= r.off+int64(len(r.buf)) {
			length := min(max(readChunk, int64(len(p)-n)), r.size-pos)
			data, _, err := r.b.GetRange(r.ctx, r.key, pos, length)
			if err != nil {
				return n, err
			}
			if len(data) == 0 {
				return n, io.ErrUnexpectedEOF
			}
			r.buf, r.off = data, pos
		}
		n += copy(p[n:], r.buf[pos-r.off:])
	}
	return n, nil
}
