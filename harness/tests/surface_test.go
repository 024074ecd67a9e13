package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNoInternalTypeInAPublicSignature reads `go doc -all` of every public
// package and fails on a declaration (a signature, a struct field, a value's
// type) that names a type of a package under internal/: no caller outside the
// module could build or name one.
func TestNoInternalTypeInAPublicSignature(t *testing.T) {
	list := func(args ...string) []string {
		out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
		if err != nil {
			t.Fatalf("go list %v: %v", args, err)
		}
		return strings.Fields(string(out))
	}
	internal := list("-f", "{{.Name}}", "github.com/l0store/l0/internal/...")
	uses := regexp.MustCompile(`\b(` + strings.Join(internal, "|") + `)\.[A-Z]\w*`)
	var public []string
	for _, p := range list("github.com/l0store/l0/...") {
		if !strings.Contains(p, "/internal/") && !strings.Contains(p, "/cmd/") && !strings.Contains(p, "/harness") &&
			!strings.HasSuffix(p, "/model") && !strings.Contains(p, "/tools") {
			public = append(public, p)
		}
	}
	if len(public) < 10 {
		t.Fatalf("only %d public packages found: %v", len(public), public)
	}
	for _, p := range public {
		out, err := exec.Command("go", "doc", "-all", p).Output()
		if err != nil {
			t.Fatalf("go doc -all %s: %v", p, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			// Declarations start at the margin, or a tab in (fields, methods of
			// an interface); their doc text is four spaces in.
			code := strings.HasPrefix(line, "\t") || (line != "" && line[0] != ' ')
			if !code || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			if m := uses.FindString(line); m != "" {
				t.Errorf("%s names the internal type %s: %s", p, m, strings.TrimSpace(line))
			}
		}
	}
}

// TestTheWALKnowsNothingOfTheTailOrTheObjectStore fails if package wal imports,
// directly or not, the tail or any package that speaks to an object store: it
// hands its pages to a sink it defines, and knows no more of where they go.
func TestTheWALKnowsNothingOfTheTailOrTheObjectStore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/l0store/l0/wal").Output()
	if err != nil {
		t.Fatalf("go list -deps wal: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("only %d dependencies of wal listed: %v", len(deps), deps)
	}
	for _, d := range deps {
		for _, banned := range []string{"/internal/tail", "/substrate", "/manifest", "/engine", "cloud.google.com/", "aws-sdk-go"} {
			if strings.Contains(d, banned) {
				t.Errorf("wal depends on %s", d)
			}
		}
	}
}

// TestThePublicSurfaceStaysSmall counts the exported functions, methods and types
// declared in the public packages' non-test files (substrate's drivers aside: a
// driver is a user's to implement) and fails above the budget: the surface a
// user reads to embed l0. Machinery belongs under internal/.
func TestThePublicSurfaceStaysSmall(t *testing.T) {
	const budget = 160
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}|{{join .GoFiles \" \"}}", "github.com/l0store/l0/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	decl := regexp.MustCompile(`(?m)^func (\([^)]*\) )?[A-Z]|^type [A-Z]`)
	total, per := 0, map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		dir, files, _ := strings.Cut(line, "|")
		rel := filepath.ToSlash(dir)
		if strings.Contains(rel, "/internal/") || strings.Contains(rel, "/substrate") || strings.Contains(rel, "/cmd/") ||
			strings.Contains(rel, "/harness") || strings.HasSuffix(rel, "/model") || strings.Contains(rel, "/tools") {
			continue
		}
		for _, f := range strings.Fields(files) {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			n := len(decl.FindAll(b, -1))
			per[filepath.Base(dir)] += n
			total += n
		}
	}
	if len(per) < 6 {
		t.Fatalf("only %d public packages counted: %v", len(per), per)
	}
	t.Logf("%d exported functions, methods and types: %v", total, per)
	if total > budget {
		t.Errorf("%d exported functions, methods and types in the public packages, over the budget of %d: %v", total, budget, per)
	}
}
