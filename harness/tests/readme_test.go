package tests

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeMarker names, on the line before a ```go block of README.md, the Example
// whose body the block is.
var readmeMarker = regexp.MustCompile(`^<!-- example: (\S+) (Example\w*) -->$`)

// TestEveryGoSnippetInTheREADMEIsCompiled: every Go block in README.md is the body
// of an Example in the repository, verbatim (one tab of indentation less), so
// that go vet and go test compile what the README shows.
func TestEveryGoSnippetInTheREADMEIsCompiled(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(readme), "\n")
	blocks := 0
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		start := i + 1
		end := start
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if end == len(lines) {
			t.Fatalf("README.md:%d: the go block does not end", i+1)
		}
		blocks++
		block := strings.Join(lines[start:end], "\n")
		i = end
		var m []string
		if start >= 2 {
			m = readmeMarker.FindStringSubmatch(lines[start-2])
		}
		if m == nil {
			t.Errorf("README.md:%d: a go block without a marker <!-- example: FILE EXAMPLE --> on the line before it", start)
			continue
		}
		body, err := exampleBody(filepath.Join("..", "..", filepath.FromSlash(m[1])), m[2])
		if err != nil {
			t.Errorf("README.md:%d: %v", start, err)
			continue
		}
		if block != body {
			t.Errorf("README.md:%d: the go block differs from the body of %s in %s:\n--- README.md\n%s\n--- %s\n%s", start, m[2], m[1], block, m[1], body)
		}
	}
	if blocks == 0 {
		t.Fatal("README.md has no go block (what this test is about changed)")
	}
}

// exampleBody is the body of function name in the Go file path, its statements
// one tab less indented.
func exampleBody(path, name string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != name || fn.Recv != nil || fn.Body == nil {
			continue
		}
		inner := src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset]
		inner = bytes.TrimPrefix(inner, []byte("\n"))
		inner = bytes.TrimSuffix(inner, []byte("\n"))
		out := strings.Split(string(inner), "\n")
		for i, l := range out {
			out[i] = strings.TrimPrefix(l, "\t")
		}
		return strings.Join(out, "\n"), nil
	}
	return "", fmt.Errorf("%s has no function %s", path, name)
}
