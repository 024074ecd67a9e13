package ownership

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/l0store/l0/clock"
	"github.com/l0store/l0/manifest"
	"github.com/l0store/l0/substrate"
)

// Store publishes manifests: compare-and-swap on the authority, then a copy to
// every other substrate in the background (see copier). It is safe for concurrent
// use; Close stops the copies.
type Store struct {
	authority *substrate.Bucket
	name      string // the authority's, in the manifests
	copies    []*copier
}

func (s *Store) authorityName() string { return s.name }

// Authority is the substrate the Store publishes to by compare-and-swap, where
// the owners' instance leases are too.
func (s *Store) Authority() *substrate.Bucket { return s.authority }

// StoreOptions configure a Store. The zero value of each field means its default.
type StoreOptions struct {
	// Logger receives the copies' failures; nil discards them.
	Logger *slog.Logger
	// CopyTimeout bounds one attempt at copying a manifest to a substrate. A copy
	// that fails is tried again a second later while the Store is open. Default 10 s.
	CopyTimeout time.Duration
	// Clock paces the copies' retries. Default clock.Real.
	Clock clock.Clock
	// AuthorityName names the authority in the manifests it fences, the same name
	// on every engine (as the replicas in a part's locations). Default the
	// authority Bucket's name.
	AuthorityName string
}

// EnsureDefaults fills in the zero fields.
func (o *StoreOptions) EnsureDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CopyTimeout <= 0 {
		o.CopyTimeout = 10 * time.Second
	}
	o.Clock = clock.OrReal(o.Clock)
}

// NewStore returns a Store over the authority substrate and the copies, with the
// default StoreOptions.
func NewStore(authority *substrate.Bucket, copies ...*substrate.Bucket) *Store {
	return NewStoreWithOptions(StoreOptions{}, authority, copies...)
}

// NewStoreWithOptions is NewStore with options.
func NewStoreWithOptions(opts StoreOptions, authority *substrate.Bucket, copies ...*substrate.Bucket) *Store {
	opts.EnsureDefaults()
	if opts.AuthorityName == "" {
		opts.AuthorityName = authority.Name()
	}
	s := &Store{authority: authority, name: opts.AuthorityName}
	for _, b := range copies {
		s.copies = append(s.copies, newCopier(b, opts))
	}
	return s
}

// Flush waits until every copy handed over before the call has landed, or ctx
// ended, or a copy failed several attempts in a row (the errors, joined). The
// copies are waited for together, so a replica that is down costs one wait, not
// one per shard.
func (s *Store) Flush(ctx context.Context) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, c := range s.copies {
		for shard, seq := range c.pending() {
			wg.Go(func() {
				if err := c.wait(ctx, shard, seq); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitCopies waits until every copy of shard's manifest of sequence seq (or a
// newer one) has landed, or failed an attempt, or ctx ended.
func (s *Store) waitCopies(ctx context.Context, shard string, seq uint64) error {
	var errs []error
	for _, c := range s.copies {
		if err := c.wait(ctx, shard, seq); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close stops the copies: those in flight are cancelled, queued ones dropped (the
// next owner's publishes bring the substrates up to date). Flush first to let them
// land. Load and publishes to the authority still work after Close.
func (s *Store) Close() {
	for _, c := range s.copies {
		c.close()
	}
}

// Load reads shard's manifest from the authority with its version. A shard never
// published has the empty manifest and the empty version.
func (s *Store) Load(ctx context.Context, shard string) (manifest.Manifest, substrate.Version, error) {
	m, ver, _, err := manifest.Read(ctx, s.authority, shard)
	return m, ver, err
}

// settle reads the authority back after a write of m, whose encoding is data,
// failed: landed reports that the authority holds exactly those bytes. The bytes
// identify the write: an earlier write of this owner with the same sequence (one
// whose outcome was unknown, built on the same view) holds different bytes, and
// taking it for this one would report a commit or a release that never happened.
func (s *Store) settle(ctx context.Context, m manifest.Manifest, data []byte) (cur manifest.Manifest, ver substrate.Version, landed bool, err error) {
	cur, ver, raw, err := manifest.Read(ctx, s.authority, m.Shard)
	if err != nil {
		return manifest.Manifest{}, "", false, err
	}
	if landed = raw != nil && bytes.Equal(raw, data); landed {
		s.published(cur, raw)
	}
	return cur, ver, landed, nil
}

// publish writes m to the authority if its version is still ver (absent when ver is
// empty) and returns the new version; substrate.ErrPreconditionFailed means another
// write came first. m.Seq must be one past the sequence of the manifest at ver. Once
// the authority holds m, the copies are handed over and publish returns: no caller
// waits on a copy.
func (s *Store) publish(ctx context.Context, m manifest.Manifest, ver substrate.Version) (substrate.Version, []byte, error) {
	data, err := manifest.Encode(m)
	if err != nil {
		return "", nil, err
	}
	key := manifest.Key(m.Shard)
	var attrs substrate.Attrs
	if ver == "" {
		var created bool
		attrs, created, err = s.authority.PutIfAbsentBytes(ctx, key, data)
		if err == nil && !created {
			err = substrate.ErrPreconditionFailed
		}
	} else {
		attrs, err = s.authority.CompareAndSwapBytes(ctx, key, ver, data)
	}
	if err != nil {
		return "", data, err
	}
	s.published(m, data)
	return attrs.Version, data, nil
}

// published hands m, which the authority holds as data, to the copies.
func (s *Store) published(m manifest.Manifest, data []byte) {
	for _, c := range s.copies {
		c.offer(m, data)
	}
}
