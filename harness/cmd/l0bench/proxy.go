package main

import (
	"context"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/l0store/l0/substrate"
)

// requestKind is what an object-store request does, told from its method, path,
// query and headers.
type requestKind string

const (
	kindGet         requestKind = "get"               // an object's bytes
	kindStat        requestKind = "stat"              // an object's metadata
	kindWrite       requestKind = "write"             // an upload without a precondition
	kindConditional requestKind = "conditional_write" // an upload with a precondition
	kindList        requestKind = "list"
	kindDelete      requestKind = "delete"
	kindOther       requestKind = "other" // buckets, and anything not above
)

// requestCounts are the requests a countingProxy forwarded, in all, by HTTP method
// and by kind.
type requestCounts struct {
	Total    int64                 `json:"total"`
	ByMethod map[string]int64      `json:"by_method"`
	ByKind   map[requestKind]int64 `json:"by_kind"`
}

// minus is the requests of c that were not yet in earlier.
func (c requestCounts) minus(earlier requestCounts) requestCounts {
	out := requestCounts{Total: c.Total - earlier.Total, ByMethod: map[string]int64{}, ByKind: map[requestKind]int64{}}
	for m, n := range c.ByMethod {
		if d := n - earlier.ByMethod[m]; d != 0 {
			out.ByMethod[m] = d
		}
	}
	for k, n := range c.ByKind {
		if d := n - earlier.ByKind[k]; d != 0 {
			out.ByKind[k] = d
		}
	}
	return out
}

// countingProxy is a reverse proxy on 127.0.0.1 in front of a remote's server that
// counts the HTTP requests it forwards: the requests that reach the object store,
// whatever the client in front of it retries, batches or caches, which is what an
// operator pays for.
type countingProxy struct {
	// endpoint is the remote's endpoint with the proxy's host in place of the
	// server's: what a client is given to go through the proxy.
	endpoint  string
	srv       *http.Server
	transport *http.Transport
	kindOf    func(*http.Request) requestKind

	mu     sync.Mutex
	counts requestCounts
}

// startProxy starts a counting proxy in front of g's server.
func startProxy(g *remote) (*countingProxy, error) {
	upstream, err := url.Parse(g.endpoint)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	through := *upstream
	through.Host = l.Addr().String()
	p := &countingProxy{
		endpoint:  through.String(),
		transport: http.DefaultTransport.(*http.Transport).Clone(),
		kindOf:    gcsRequestKind,
		counts:    requestCounts{ByMethod: map[string]int64{}, ByKind: map[requestKind]int64{}},
	}
	if g.kind == "s3" {
		p.kindOf = s3RequestKind
	}
	server := &url.URL{Scheme: upstream.Scheme, Host: upstream.Host}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(server)
			// The Host the client sent, the proxy's: S3's SigV4 signs it, and
			// fake-gcs-server builds from it the URL a resumable upload's chunks
			// go to, which so goes through the proxy too.
			r.Out.Host = r.In.Host
		},
		Transport: p.transport,
	}
	p.srv = &http.Server{Handler: p.counting(rp), ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(l)
	return p, nil
}

// counting counts each request, then hands it to next.
func (p *countingProxy) counting(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := p.kindOf(r)
		p.mu.Lock()
		p.counts.Total++
		p.counts.ByMethod[r.Method]++
		p.counts.ByKind[k]++
		p.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// snapshot is the requests forwarded so far.
func (p *countingProxy) snapshot() requestCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return requestCounts{Total: p.counts.Total, ByMethod: maps.Clone(p.counts.ByMethod), ByKind: maps.Clone(p.counts.ByKind)}
}

// stop closes the proxy and its connections to the server.
func (p *countingProxy) stop() {
	p.srv.Close()
	p.transport.CloseIdleConnections()
}

// newBucketThrough creates a fresh bucket on g, as g.newBucket does, whose every
// request (its creation included) goes through p.
func newBucketThrough(ctx context.Context, g *remote, p *countingProxy) (*substrate.Bucket, error) {
	via := &remote{kind: g.kind, endpoint: p.endpoint, stop: func() {}, accessKey: g.accessKey, secretKey: g.secretKey}
	return via.newBucket(ctx)
}

// gcsRequestKind tells a request of the GCS JSON API: uploads go to
// /upload/storage/v1/b/BUCKET/o and are conditional with ifGenerationMatch in the
// query; objects are /storage/v1/b/BUCKET/o/NAME, their bytes with alt=media; a
// listing is /storage/v1/b/BUCKET/o.
func gcsRequestKind(r *http.Request) requestKind {
	q := r.URL.Query()
	upload := strings.Contains(r.URL.Path, "/upload/")
	_, object, isObject := strings.Cut(r.URL.Path, "/o/")
	switch {
	case upload && q.Has("ifGenerationMatch"):
		return kindConditional
	case upload && (r.Method == http.MethodPost || r.Method == http.MethodPut):
		return kindWrite
	case r.Method == http.MethodGet && isObject && object != "" && q.Get("alt") == "media":
		return kindGet
	case r.Method == http.MethodGet && isObject && object != "":
		return kindStat
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/o"):
		return kindList
	case r.Method == http.MethodDelete && isObject:
		return kindDelete
	}
	return kindOther
}

// s3RequestKind tells a path-style S3 request: /BUCKET/KEY is an object, /BUCKET
// the bucket; a write is conditional with If-Match or If-None-Match.
func s3RequestKind(r *http.Request) requestKind {
	_, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	conditional := r.Header.Get("If-Match") != "" || r.Header.Get("If-None-Match") != ""
	write := key != "" && (r.Method == http.MethodPut || r.Method == http.MethodPost)
	switch {
	case write && conditional:
		return kindConditional
	case write:
		return kindWrite
	case key != "" && r.Method == http.MethodGet:
		return kindGet
	case key != "" && r.Method == http.MethodHead:
		return kindStat
	case key == "" && r.Method == http.MethodGet:
		return kindList
	case r.Method == http.MethodDelete && key != "", r.Method == http.MethodPost && r.URL.Query().Has("delete"):
		return kindDelete
	}
	return kindOther
}
