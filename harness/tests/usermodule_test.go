package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testOnly are modules only l0's tests, the harness or l0bench need: fake-gcs-server
// and what it pulls in, versitygw, porcupine, rapid. A module that imports l0 must
// not find any in its go.sum. (goleak is not here: prometheus/client_golang's own
// tests import it, so a module importing prometheus gets it whatever l0 does.)
var testOnly = []string{
	"github.com/fsouza/fake-gcs-server",
	"github.com/versity/versitygw",
	"github.com/anishathalye/porcupine",
	"pgregory.net/rapid",
	"github.com/gorilla/mux",
	"github.com/gorilla/handlers",
	"cloud.google.com/go/pubsub/v2",
	"github.com/pkg/xattr",
	"github.com/google/renameio/v2",
}

// viaDependencyTestHelpers are modules that l0's tests do pull into a user's
// go.sum, but that a real dependency brings there anyway: prometheus/client_golang's
// testutil, which the metrics tests use, imports kylelemons/godebug; goleak, which
// l0's tests use, is imported by prometheus/client_golang's own tests.
var viaDependencyTestHelpers = []string{
	"github.com/kylelemons/godebug",
	"go.uber.org/goleak",
}

// TestAModuleImportingL0GetsNoTestOnlyModule builds, offline from the module cache,
// a module that imports engine, fleet and the GCS and S3 drivers, with l0 replaced
// by this checkout, and fails if its go.sum names a module only l0's tests or
// harness need; and if the tests of the l0 packages it imports (which go mod tidy
// loads, so go.sum holds what they need) need a module the build does not, beyond
// viaDependencyTestHelpers.
func TestAModuleImportingL0GetsNoTestOnlyModule(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/l0user\n\ngo 1.26.0\n\n"+
		"require github.com/l0store/l0 v0.0.0-00010101000000-000000000000\n\n"+
		"replace github.com/l0store/l0 => "+root+"\n")
	write("main.go", `package main

import (
	_ "github.com/l0store/l0/engine"
	_ "github.com/l0store/l0/fleet"
	_ "github.com/l0store/l0/substrate/gcs"
	_ "github.com/l0store/l0/substrate/s3"
)

func main() {}
`)
	goCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// Offline: everything comes from the module cache the harness was built from.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off", "GOWORK=off", "GOTOOLCHAIN=local")
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		return string(out)
	}
	goCmd("mod", "tidy")
	goCmd("build", "-o", filepath.Join(dir, "l0user"), ".")

	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	inSum := map[string]bool{}
	for _, line := range strings.Split(string(sum), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			inSum[f[0]] = true
		}
	}
	if len(inSum) < 20 {
		t.Fatalf("go.sum names only %d modules (what this test is about changed):\n%s", len(inSum), sum)
	}
	t.Logf("the user module's go.sum names %d modules", len(inSum))
	for _, m := range testOnly {
		if inSum[m] {
			t.Errorf("a module importing l0 has %s in its go.sum; go mod why -m says:\n%s", m, goCmd("mod", "why", "-m", m))
		}
	}

	// What the build needs, and the l0 packages in it.
	modules := `{{with .Module}}{{.Path}}{{end}}`
	built := strings.Fields(goCmd("list", "-deps", "-f", modules, "."))
	l0 := strings.Fields(goCmd("list", "-deps", "-f", `{{with .Module}}{{if eq .Path "github.com/l0store/l0"}}{{$.ImportPath}}{{end}}{{end}}`, "."))
	if len(l0) < 5 {
		t.Fatalf("only %d l0 packages in the build: %v", len(l0), l0)
	}
	// What those packages' tests need, transitively.
	forTests := strings.Fields(goCmd(append([]string{"list", "-test", "-deps", "-f", modules}, l0...)...))
	slices.Sort(forTests)
	for _, m := range slices.Compact(forTests) {
		if !slices.Contains(built, m) && !slices.Contains(viaDependencyTestHelpers, m) && inSum[m] {
			t.Errorf("the tests of the l0 packages a user imports bring %s into the user's go.sum", m)
		}
	}
}
