package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/l0store/l0/substrate"
	"github.com/l0store/l0/substrate/gcs"
	"github.com/l0store/l0/substrate/local"
	"github.com/l0store/l0/substrate/s3"
)

// The storage flags every command takes: the store's replicas, by name, and which
// of them is the authority (where the manifests and the leases are).

// replicaArg is one -replica flag: NAME=URL.
type replicaArg struct{ name, url string }

// replicaList is the repeatable -replica flag.
type replicaList []replicaArg

func (l *replicaList) String() string {
	parts := make([]string, len(*l))
	for i, r := range *l {
		parts[i] = r.name + "=" + r.url
	}
	return strings.Join(parts, " ")
}

func (l *replicaList) Set(v string) error {
	name, url, ok := strings.Cut(v, "=")
	if !ok || name == "" || url == "" {
		return fmt.Errorf("want NAME=URL, got %q", v)
	}
	if err := substrate.ValidateKey(name); err != nil || strings.Contains(name, "/") {
		return fmt.Errorf("replica name %q: not a valid name", name)
	}
	for _, r := range *l {
		if r.name == name {
			return fmt.Errorf("replica %q given twice", name)
		}
	}
	if _, _, err := parseURL(url); err != nil {
		return err
	}
	*l = append(*l, replicaArg{name, url})
	return nil
}

// storeFlags are the storage flags of one command.
type storeFlags struct {
	replicas  replicaList
	authority string
	timeout   time.Duration
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.replicas, "replica", "a replica of the store, `NAME=URL` with URL gcs://BUCKET, s3://BUCKET or dir:///PATH (repeatable; the first is the authority unless -authority)")
	fs.StringVar(&f.authority, "authority", "", "the `NAME` of the replica that holds the manifests and leases (default: the first -replica)")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up after this long (0: no limit)")
}

// storageHelp is the part of every command's help about reaching the store.
const storageHelp = `Endpoints and credentials come from the environment, as for l0's tests and l0bench:
STORAGE_EMULATOR_HOST (host:port of a GCS emulator; otherwise Google's endpoint and
application default credentials), AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (or the rest of the AWS credential chain) for S3.
`

// usageError is an error in how the command was called: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// isUsage reports whether err is a usageError.
func isUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}

// storeReplica is one opened replica of the store.
type storeReplica struct {
	Name, URL string
	Bucket    *substrate.Bucket
}

// store is the replicas the flags named, opened.
type store struct {
	replicas  []storeReplica // in the flags' order
	authority int
}

// Authority is the replica that holds the manifests and leases.
func (s *store) Authority() storeReplica { return s.replicas[s.authority] }

// Copies are every replica but the authority, in the flags' order.
func (s *store) Copies() []storeReplica {
	var out []storeReplica
	for i, r := range s.replicas {
		if i != s.authority {
			out = append(out, r)
		}
	}
	return out
}

// Get returns the replica named name.
func (s *store) Get(name string) (storeReplica, bool) {
	for _, r := range s.replicas {
		if r.Name == name {
			return r, true
		}
	}
	return storeReplica{}, false
}

// Names are the replicas' names, in the flags' order.
func (s *store) Names() []string {
	out := make([]string, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = r.Name
	}
	return out
}

func (s *store) Close() {
	for _, r := range s.replicas {
		r.Bucket.Close()
	}
}

// openStore opens every replica the flags name. Flags that name no replica, or
// an authority that is not one, are a usageError.
func openStore(ctx context.Context, f storeFlags) (*store, error) {
	if len(f.replicas) == 0 {
		return nil, usageErrorf("no -replica: name the store's replicas, e.g. -replica main=gcs://my-bucket")
	}
	s := &store{authority: -1}
	for i, r := range f.replicas {
		if r.name == f.authority || (f.authority == "" && i == 0) {
			s.authority = i
		}
	}
	if s.authority < 0 {
		return nil, usageErrorf("-authority %q is not one of the -replica names", f.authority)
	}
	for _, r := range f.replicas {
		b, err := openBucket(ctx, r.name, r.url)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("replica %s (%s): %w", r.name, r.url, err)
		}
		s.replicas = append(s.replicas, storeReplica{Name: r.name, URL: r.url, Bucket: b})
	}
	return s, nil
}

// parseURL splits a replica's URL into its kind (gcs, s3, dir) and its bucket or
// path.
func parseURL(url string) (kind, where string, err error) {
	kind, where, ok := strings.Cut(url, "://")
	switch {
	case !ok || where == "":
	case kind == "gcs" || kind == "s3":
		if !strings.Contains(where, "/") {
			return kind, where, nil
		}
	case kind == "dir":
		return kind, where, nil
	}
	return "", "", fmt.Errorf("replica URL %q: want gcs://BUCKET, s3://BUCKET or dir:///PATH", url)
}

// openBucket opens the replica name at url. The clients are the ones the
// substrate drivers make, pointed at the endpoints the environment names, as
// l0bench does; a dir replica must exist already, so that a mistyped path reads
// as an error rather than as an empty store.
func openBucket(ctx context.Context, name, url string) (*substrate.Bucket, error) {
	kind, where, err := parseURL(url)
	if err != nil {
		return nil, err
	}
	var d substrate.Driver
	switch kind {
	case "gcs":
		cfg := gcs.Config{Bucket: where}
		if host := os.Getenv("STORAGE_EMULATOR_HOST"); host != "" {
			if !strings.Contains(host, "://") {
				host = "http://" + host
			}
			cfg.Endpoint = strings.TrimSuffix(host, "/") + "/storage/v1/"
		}
		d, err = gcs.Open(ctx, cfg)
	case "s3":
		d, err = s3.Open(ctx, s3.Config{Bucket: where})
	case "dir":
		if fi, serr := os.Stat(where); serr != nil {
			return nil, serr
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("%s is not a directory", where)
		}
		d, err = local.New(where)
	}
	if err != nil {
		return nil, err
	}
	return substrate.New(d, substrate.Options{Name: name})
}
