package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
)

// TestATableReadsTheSameInTextAndMarkdown: a table prints the text tabwriter
// printed, and its Markdown is a pipe table of the same rows, figures aligned
// right, a pipe in a cell escaped; the title is bold and each other line a line of
// its own.
func TestATableReadsTheSameInTextAndMarkdown(t *testing.T) {
	rows := "contender\tMB/s\tvs raw\ttarget\t\n" +
		"l0 | remote\t162 (155-176)\t0.31x (0.29-0.33)\t≤ 1: met\t\n" +
		"  of which the seal\t-\t\t-\t\n" +
		"raw\t+4\t1.00x\t-\t\n"
	var want bytes.Buffer
	tw := tabwriter.NewWriter(&want, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, rows)
	tw.Flush()

	var text bytes.Buffer
	md := newMarkdownWriter(&text)
	title(md, "append", "%d B records", 1024)
	tb := newTable(md)
	fmt.Fprint(tb, rows)
	if err := tb.Flush(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(md, "target one: met")
	fmt.Fprintln(md, "note: two")
	fmt.Fprintln(md)

	if got := text.String(); got != "append · 1024 B records\n"+want.String()+"target one: met\nnote: two\n\n" {
		t.Fatalf("text:\n%s\nwant the tabwriter's:\n%s", got, want.String())
	}
	wantMD := "**append** — 1024 B records\n\n" +
		"| contender | MB/s | vs raw | target |\n" +
		"|---|---:|---:|---|\n" +
		`| l0 \| remote | 162 (155-176) | 0.31x (0.29-0.33) | ≤ 1: met |` + "\n" +
		"| of which the seal | - |  | - |\n" +
		"| raw | +4 | 1.00x | - |\n" +
		"\n" +
		"target one: met  \n" +
		"note: two\n"
	if got := md.String(); got != wantMD {
		t.Fatalf("Markdown:\n%s\nwant:\n%s", got, wantMD)
	}

	// Without a markdownWriter a table is the tabwriter it replaces.
	var plain bytes.Buffer
	tb = newTable(&plain)
	fmt.Fprint(tb, rows)
	if err := tb.Flush(); err != nil {
		t.Fatal(err)
	}
	if plain.String() != want.String() {
		t.Fatalf("text:\n%s\nwant:\n%s", plain.String(), want.String())
	}
}

// TestSpliceReplacesOnlyItsSections: a splice replaces the named sections, keeps
// every other byte, puts a section the file lacks after its last one (or at the
// end of its Results, or under a Results heading of its own), and a second splice
// of the same sections changes nothing.
func TestSpliceReplacesOnlyItsSections(t *testing.T) {
	before := "# Benchmarks\n\nThe method.\n\n## Results\n\nFrom a run.  \n\n"
	seal := section{name: "seal", body: "old seal\n"}
	between := "\nprose between, kept\n\n"
	lag := section{name: "lag", body: "old lag\n"}
	after := "\n### Drivers\n\n| a | b |\n|---|---|\n"
	doc := before + seal.String() + between + lag.String() + after

	newSeal := section{name: "seal", body: "Run by l0bench\n\n**seal** — new  \nnote\n"}
	idle := section{name: "idle", body: "idle figures\n"}
	got, err := splice(doc, []section{newSeal, idle})
	if err != nil {
		t.Fatal(err)
	}
	want := before + newSeal.String() + between + lag.String() + "\n" + idle.String() + after
	if got != want {
		t.Fatalf("spliced:\n%s\nwant:\n%s", got, want)
	}
	again, err := splice(got, []section{newSeal, idle})
	if err != nil {
		t.Fatal(err)
	}
	if again != got {
		t.Fatalf("a second splice changed the file:\n%s\nwas:\n%s", again, got)
	}
	parsed, err := parseSections(got)
	if err != nil || len(parsed) != 3 || parsed[0] != newSeal || parsed[1] != lag || parsed[2] != idle {
		t.Fatalf("sections read back: %+v, %v", parsed, err)
	}

	// No section yet: at the end of the Results part, before the next heading.
	doc = "# B\n\n## Results\n\nsome\n\n## Other endpoints\n\nmore\n"
	got, err = splice(doc, []section{idle})
	if want := "# B\n\n## Results\n\nsome\n\n" + idle.String() + "\n## Other endpoints\n\nmore\n"; err != nil || got != want {
		t.Fatalf("spliced:\n%s\nwant:\n%s (%v)", got, want, err)
	}
	// No Results heading, or no file: one of its own at the end.
	for _, doc := range []string{"# B\n\nthe method", ""} {
		got, err = splice(doc, []section{idle, seal})
		want := paragraphEnd(doc) + "## Results\n\n" + idle.String() + "\n" + seal.String()
		if err != nil || got != want {
			t.Fatalf("spliced %q:\n%s\nwant:\n%s (%v)", doc, got, want, err)
		}
	}
	// A marker quoted in prose is not one, and broken markers are refused.
	quoted := "the lines `" + beginMarker("seal") + "` and so on\n"
	if got, err := splice(quoted, nil); err != nil || got != quoted {
		t.Fatalf("prose quoting a marker: %q, %v", got, err)
	}
	for _, bad := range []string{
		beginMarker("seal") + "\nno end\n",
		"no begin\n" + endMarker("seal") + "\n",
		beginMarker("seal") + "\n" + beginMarker("lag") + "\n" + endMarker("lag") + "\n" + endMarker("seal") + "\n",
		seal.String() + seal.String(),
	} {
		if _, err := splice(bad, []section{seal}); err == nil {
			t.Fatalf("spliced into a broken file:\n%s", bad)
		}
	}
}

// TestAMarkdownRunRewritesItsScenariosSectionsInBENCHMARKS runs a suite of two
// cheap scenarios with -quick -markdown on a copy of the repository's
// BENCHMARKS.md: their sections hold what the run printed, stamped with the run,
// and every other byte of the file is as it was.
func TestAMarkdownRunRewritesItsScenariosSectionsInBENCHMARKS(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join("..", "..", "..", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := os.WriteFile(file, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	ran := []string{"seal", "inherited-seal"}
	heads := map[string]string{
		"seal":           "| contender | MB/s | vs zstd | CPU ms / MB |\n|---|---:|---:|---:|\n",
		"inherited-seal": "| contender | ms | vs direct |\n|---|---:|---:|\n",
	}
	rows := map[string]string{"seal": "zstd SpeedFastest, 64 KiB blocks, 1 core", "inherited-seal": "direct seal of the same backlog"}
	cmd := exec.Command(os.Args[0], "-scenario="+strings.Join(ran, ","), "-quick", "-markdown="+file,
		"-results="+filepath.Join(t.TempDir(), "results.jsonl"), "-dir="+t.TempDir())
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, stderr.String())
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	before, err := sectionsOf(string(orig))
	if err != nil {
		t.Fatal(err)
	}
	after, err := sectionsOf(string(got))
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("%d sections, %d before", len(after), len(before))
	}
	for i, s := range after {
		if s.name != before[i].name {
			t.Fatalf("section %d is %s, was %s", i, s.name, before[i].name)
		}
		if !slices.Contains(ran, s.name) {
			if s.body != before[i].body {
				t.Fatalf("the section %s, not run, changed:\n%s", s.name, s.body)
			}
			continue
		}
		for _, want := range []string{"Run by l0bench ", " · flags -quick\n", "**" + s.name + "** — ", heads[s.name]} {
			if !strings.Contains(s.body, want) {
				t.Fatalf("the section %s lacks %q:\n%s", s.name, want, s.body)
			}
		}
		// The row the text printed is the Markdown's, cell for cell.
		line := regexp.MustCompile(`(?m)^ *` + regexp.QuoteMeta(rows[s.name]) + `.*$`).FindString(string(out))
		cells := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
		if row := "| " + strings.Join(cells, " | ") + " |\n"; len(cells) < 3 || !strings.Contains(s.body, row) {
			t.Fatalf("the section %s lacks the row printed, %s:\n%s", s.name, row, s.body)
		}
	}
	if outside(string(got), after) != outside(string(orig), before) {
		t.Fatal("the file changed outside the sections run")
	}
	if !strings.Contains(string(out), "Markdown written into "+file) {
		t.Fatalf("output:\n%s", out)
	}
}

// outside is doc without its sections.
func outside(doc string, spans []span) string {
	var b strings.Builder
	at := 0
	for _, s := range spans {
		b.WriteString(doc[at:s.start])
		at = s.end
	}
	b.WriteString(doc[at:])
	return b.String()
}
