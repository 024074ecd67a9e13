// Package emulator starts the object-store emulators that tests and l0bench run
// against: fake-gcs-server and versitygw (S3) as processes, on 127.0.0.1. Binaries
// come from the paths in L0_FAKE_GCS_SERVER and L0_VERSITYGW, which `make emulators`
// builds and the Makefile exports.
//
// fake-gcs-server served from the test process itself is the harness module's
// (harness/internal/fakegcs): importing it here would put fake-gcs-server and all
// it needs into the module graph of every module that imports l0.
package emulator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"

	"github.com/l0store/l0/substrate/gcs"
)

// The environment variables that name the emulator binaries, and that point tests at
// emulators already running.
const (
	EnvFakeGCSServer = "L0_FAKE_GCS_SERVER"
	EnvVersitygw     = "L0_VERSITYGW"
	// EnvGCSHost is the GCS client's own convention: host:port of an emulator.
	EnvGCSHost = "STORAGE_EMULATOR_HOST"
	// EnvS3Endpoint points the S3 tests at a running S3-compatible server; its
	// credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
	EnvS3Endpoint = "L0_S3_ENDPOINT"
)

// ErrNoBinary reports that an emulator binary is not where the environment says.
var ErrNoBinary = errors.New("emulator: binary not found (run `make emulators`, or `make test`, which exports its path)")

// GCS is a running fake-gcs-server.
type GCS struct {
	// Endpoint is the JSON API base URL for option.WithEndpoint.
	Endpoint string
	stop     func() error
}

// Stop stops the server. A server that was already running (STORAGE_EMULATOR_HOST)
// is left alone.
func (g *GCS) Stop() error { return g.stop() }

// NewGCS is a GCS at endpoint (a JSON API base URL) that stop stops: a server the
// caller started some other way.
func NewGCS(endpoint string, stop func() error) *GCS { return &GCS{Endpoint: endpoint, stop: stop} }

// NewGCSDriver creates the bucket name on the fake-gcs-server at endpoint (a JSON API
// base URL, as GCS.Endpoint) and opens a GCS driver on it, both through the GCS
// client over HTTP, without credentials.
func NewGCSDriver(ctx context.Context, endpoint, name string) (*gcs.Driver, error) {
	admin, err := storage.NewClient(ctx, option.WithEndpoint(endpoint), option.WithoutAuthentication())
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := admin.Bucket(name).Create(ctx, "l0", nil); err != nil {
		return nil, fmt.Errorf("emulator: create bucket %s: %w", name, err)
	}
	return gcs.Open(ctx, gcs.Config{Bucket: name, Endpoint: endpoint, ClientOptions: []option.ClientOption{option.WithoutAuthentication()}})
}

// NewDriver is NewGCSDriver on g.
func (g *GCS) NewDriver(ctx context.Context, name string) (*gcs.Driver, error) {
	return NewGCSDriver(ctx, g.Endpoint, name)
}

// StartGCSProcess starts the fake-gcs-server binary (memory backend) on a free
// loopback port, or uses the emulator at STORAGE_EMULATOR_HOST when that is set.
func StartGCSProcess() (*GCS, error) {
	if host := os.Getenv(EnvGCSHost); host != "" {
		return &GCS{Endpoint: "http://" + host + "/storage/v1/", stop: func() error { return nil }}, nil
	}
	bin, err := binary(EnvFakeGCSServer)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	p, err := startProcess(bin, url+"/storage/v1/b?project=l0",
		"-scheme", "http", "-host", "127.0.0.1", "-port", fmt.Sprint(port),
		"-external-url", url, "-backend", "memory", "-log-level", "error")
	if err != nil {
		return nil, err
	}
	return &GCS{Endpoint: url + "/storage/v1/", stop: p.stop}, nil
}

// S3 is a running S3-compatible server.
type S3 struct {
	Endpoint  string
	AccessKey string
	SecretKey string
	stop      func() error
}

// Stop stops the server and removes its data, unless it was already running.
func (s *S3) Stop() error { return s.stop() }

// StartS3Process starts versitygw with its posix backend in a new temporary directory
// on a free loopback port, or uses the server at L0_S3_ENDPOINT when that is set.
func StartS3Process() (*S3, error) {
	if ep := os.Getenv(EnvS3Endpoint); ep != "" {
		return &S3{Endpoint: ep, AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
			stop: func() error { return nil }}, nil
	}
	bin, err := binary(EnvVersitygw)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "l0-versitygw-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &S3{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), AccessKey: "l0test", SecretKey: "l0testsecret"}
	p, err := startProcess(bin, s.Endpoint+"/",
		"--port", fmt.Sprintf("127.0.0.1:%d", port), "--access", s.AccessKey, "--secret", s.SecretKey,
		"--quiet", "posix", dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.stop = func() error {
		err := p.stop()
		return errors.Join(err, os.RemoveAll(dir))
	}
	return s, nil
}

func binary(env string) (string, error) {
	path := os.Getenv(env)
	if path == "" {
		return "", fmt.Errorf("%w: %s is not set", ErrNoBinary, env)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: %s=%s: %v", ErrNoBinary, env, path, err)
	}
	return path, nil
}

type process struct {
	cmd  *exec.Cmd
	done chan error
}

// startProcess runs bin and waits until readyURL answers HTTP at all.
func startProcess(bin, readyURL string, args ...string) (*process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = io.Discard
	stderr := &tail{}
	cmd.Stderr = stderr
	// The emulator dies with the test binary, even if the test binary is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("emulator: start %s: %w", bin, err)
	}
	p := &process{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, readyURL, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			return p, nil
		}
		select {
		case err := <-p.done:
			return nil, fmt.Errorf("emulator: %s exited before it served: %v: %s", bin, err, stderr)
		case <-ctx.Done():
			p.stop()
			return nil, fmt.Errorf("emulator: %s did not serve %s within 30s: %s", bin, readyURL, stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *process) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// tail keeps the last few KiB a process wrote, for error messages.
type tail struct {
	mu sync.Mutex
	b  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

func freePort() (uint16, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("emulator: free port: %w", err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port), nil
}
