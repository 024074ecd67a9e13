// Package fakegcs serves fake-gcs-server's memory backend from the calling process,
// for l0bench and the GCS driver's in-process tests. It lives in the harness module
// so that fake-gcs-server never enters the library's module graph; the library's
// own tests run fake-gcs-server as a process (internal/emulator).
package fakegcs

import (
	"fmt"
	"io"
	"net"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/l0store/l0/internal/emulator"
)

// Start serves fake-gcs-server's memory backend from this process over a real
// loopback listener, so that requests cross HTTP as they would to GCS.
func Start() (*emulator.GCS, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakegcs: free port: %w", err)
	}
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme:      "http",
		Host:        "127.0.0.1",
		Port:        port,
		ExternalURL: fmt.Sprintf("http://127.0.0.1:%d", port),
		Writer:      io.Discard,
	})
	if err != nil {
		return nil, fmt.Errorf("fakegcs: fake-gcs-server in process: %w", err)
	}
	return emulator.NewGCS(srv.URL()+"/storage/v1/", func() error { srv.Stop(); return nil }), nil
}
