package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/l0store/l0/internal/fsutil"
)

// table is one table of a scenario's output. Its rows are written to it as to a
// tabwriter, each cell ended by a tab, so that every site keeps its Fprintf; Flush
// prints them aligned on the right, as l0bench always has, and, when the scenario
// writes to a markdownWriter, keeps the same rows as a Markdown table: the text
// and the Markdown cannot disagree.
type table struct {
	out  io.Writer
	rows bytes.Buffer
}

func newTable(out io.Writer) *table { return &table{out: out} }

func (t *table) Write(p []byte) (int, error) { return t.rows.Write(p) }

// Flush prints the rows written since the last Flush.
func (t *table) Flush() error {
	md, _ := t.out.(*markdownWriter)
	text := t.out
	if md != nil {
		text = md.text // the table goes to the Markdown as a table, not as lines
	}
	tw := tabwriter.NewWriter(text, 0, 0, 2, ' ', tabwriter.AlignRight)
	if _, err := tw.Write(t.rows.Bytes()); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if md != nil {
		md.table(cellsOf(t.rows.String()))
	}
	t.rows.Reset()
	return nil
}

// cellsOf splits tabwriter input into rows of cells. A cell is ended by a tab, as
// in a tabwriter; what follows a row's last tab is a cell only when it is not empty.
func cellsOf(text string) [][]string {
	var rows [][]string
	for line := range strings.Lines(text) {
		cells := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if last := len(cells) - 1; last > 0 && cells[last] == "" {
			cells = cells[:last]
		}
		rows = append(rows, cells)
	}
	return rows
}

// markdownTable renders rows, the first the header, as a pipe table. A column is
// aligned right when it holds figures: every cell of its body a number or a "-".
func markdownTable(rows [][]string) string {
	if len(rows) == 0 {
		return ""
	}
	cols := 0
	for _, r := range rows {
		cols = max(cols, len(r))
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i := range cols {
			c := ""
			if i < len(cells) {
				c = markdownCell(cells[i])
			}
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	line(rows[0])
	b.WriteString("|")
	for i := range cols {
		if numericColumn(rows[1:], i) {
			b.WriteString("---:|")
		} else {
			b.WriteString("---|")
		}
	}
	b.WriteString("\n")
	for _, r := range rows[1:] {
		line(r)
	}
	return b.String()
}

// markdownCell is c as the content of a pipe table's cell: a pipe in it would end
// the cell, and the spaces that indent it in the text table are dropped by
// Markdown anyway.
func markdownCell(c string) string {
	return strings.ReplaceAll(strings.TrimSpace(c), "|", `\|`)
}

// numericColumn reports whether column i of rows holds figures: at least one cell
// that starts with a digit (a sign before it allowed, as in a growth of +4), and
// besides those only "-" or nothing.
func numericColumn(rows [][]string, i int) bool {
	figures := 0
	for _, r := range rows {
		c := ""
		if i < len(r) {
			c = strings.TrimSpace(r[i])
		}
		switch {
		case c == "" || c == "-":
		case startsWithFigure(c):
			figures++
		default:
			return false
		}
	}
	return figures > 0
}

func startsWithFigure(c string) bool {
	c = strings.TrimLeft(c, "+-")
	return c != "" && unicode.IsDigit(rune(c[0]))
}

// markdownWriter is what a scenario writes to under -markdown: it passes the text
// on as it is, and keeps the same output as Markdown, each line a line of its own
// (two trailing spaces end it), its title bold and its tables pipe tables.
type markdownWriter struct {
	text io.Writer
	md   strings.Builder
	line []byte // the start of a line not yet ended
}

func newMarkdownWriter(text io.Writer) *markdownWriter { return &markdownWriter{text: text} }

func (w *markdownWriter) Write(p []byte) (int, error) {
	n, err := w.text.Write(p)
	w.line = append(w.line, p[:n]...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			break
		}
		w.plain(string(w.line[:i]))
		w.line = w.line[i+1:]
	}
	return n, err
}

// plain adds one line of text. Its indentation is dropped: four spaces would make
// it a code block.
func (w *markdownWriter) plain(l string) {
	l = strings.TrimSpace(l)
	if l == "" {
		w.blank()
		return
	}
	w.md.WriteString(l + "  \n")
}

// blank ends the paragraph, once however many blank lines the text has.
func (w *markdownWriter) blank() {
	if s := w.md.String(); s != "" && !strings.HasSuffix(s, "\n\n") {
		w.md.WriteString("\n")
	}
}

// endLine adds a line the text has not ended yet, before a title or a table.
func (w *markdownWriter) endLine() {
	if len(w.line) > 0 {
		w.plain(string(w.line))
		w.line = w.line[:0]
	}
}

func (w *markdownWriter) table(rows [][]string) {
	w.endLine()
	w.blank()
	w.md.WriteString(markdownTable(rows))
	w.md.WriteString("\n")
}

func (w *markdownWriter) title(name, rest string) {
	w.endLine()
	w.blank()
	w.md.WriteString("**" + name + "** — " + rest + "\n\n")
}

// String is the Markdown of everything written, ended by one newline.
func (w *markdownWriter) String() string {
	w.endLine()
	return strings.TrimRight(w.md.String(), " \n") + "\n"
}

// title prints a scenario's title line, "name · what it measures", and makes it
// bold in the Markdown.
func title(out io.Writer, name, format string, args ...any) {
	rest := fmt.Sprintf(format, args...)
	if md, ok := out.(*markdownWriter); ok {
		fmt.Fprintf(md.text, "%s · %s\n", name, rest)
		md.title(name, rest)
		return
	}
	fmt.Fprintf(out, "%s · %s\n", name, rest)
}

// section is one scenario's results in a Markdown file, between its markers.
type section struct {
	name string
	body string // ended by one newline
}

func beginMarker(name string) string { return "<!-- l0bench:begin " + name + " -->" }
func endMarker(name string) string   { return "<!-- l0bench:end " + name + " -->" }

// String is the section with its markers, blank lines between them and the body so
// that the comments stay blocks of their own.
func (s section) String() string {
	return beginMarker(s.name) + "\n\n" + s.body + "\n" + endMarker(s.name) + "\n"
}

// runStamp is the line that opens a scenario's section: which build ran it, where
// and when, with which flags.
func runStamp(cfg config, start time.Time) string {
	s := fmt.Sprintf("Run by l0bench %s · %s · %d cores · %s", commitID(), runtime.Version(), runtime.NumCPU(), start.UTC().Format("2006-01-02 15:04 MST"))
	if cfg.flags != "" {
		s += " · " + cfg.flags
	}
	return s
}

// markerLine returns the name of the section a line begins or ends, if it is a
// marker: markers are whole lines, so that one quoted in prose is not one.
func markerLine(line string) (name string, begin, ok bool) {
	line = strings.TrimRight(line, " \t\r\n")
	if n, found := strings.CutPrefix(line, "<!-- l0bench:begin "); found {
		if n, found = strings.CutSuffix(n, " -->"); found && n != "" {
			return n, true, true
		}
	}
	if n, found := strings.CutPrefix(line, "<!-- l0bench:end "); found {
		if n, found = strings.CutSuffix(n, " -->"); found && n != "" {
			return n, false, true
		}
	}
	return "", false, false
}

// span is where a section is in a document: from the start of its begin marker's
// line to the end of its end marker's.
type span struct {
	name       string
	start, end int
	body       string
}

// sectionsOf finds every section of doc. A begin marker without its end, an end
// without its begin, a section inside another or two of one name are errors: a
// splice would otherwise eat or duplicate what the author wrote.
func sectionsOf(doc string) ([]span, error) {
	var spans []span
	open := -1
	var openName string
	var bodyStart int
	off := 0
	for line := range strings.Lines(doc) {
		start := off
		off += len(line)
		name, begin, ok := markerLine(line)
		switch {
		case !ok:
		case begin && open >= 0:
			return nil, fmt.Errorf("the section %s begins inside the section %s", name, openName)
		case begin:
			for _, s := range spans {
				if s.name == name {
					return nil, fmt.Errorf("two sections %s", name)
				}
			}
			open, openName, bodyStart = start, name, off
		case open < 0 || name != openName:
			return nil, fmt.Errorf("the section %s ends where it has not begun", name)
		default:
			spans = append(spans, span{name: name, start: open, end: off, body: strings.Trim(doc[bodyStart:start], "\n") + "\n"})
			open = -1
		}
	}
	if open >= 0 {
		return nil, fmt.Errorf("the section %s does not end", openName)
	}
	return spans, nil
}

// parseSections reads the sections a scenario process wrote.
func parseSections(doc string) ([]section, error) {
	spans, err := sectionsOf(doc)
	if err != nil {
		return nil, err
	}
	var out []section
	for _, s := range spans {
		out = append(out, section{name: s.name, body: s.body})
	}
	return out, nil
}

// splice returns doc with each section in place of its namesake, markers included,
// and every other byte as it was. A section doc lacks goes after the last section
// it has; in a document with none, at the end of its "## Results" part, or under a
// new "## Results" heading at its end.
func splice(doc string, sections []section) (string, error) {
	var missing []section
	for _, s := range sections {
		spans, err := sectionsOf(doc)
		if err != nil {
			return "", err
		}
		i := indexOf(spans, s.name)
		if i < 0 {
			missing = append(missing, s)
			continue
		}
		doc = doc[:spans[i].start] + s.String() + doc[spans[i].end:]
	}
	if len(missing) == 0 {
		return doc, nil
	}
	var add strings.Builder
	for i, s := range missing {
		if i > 0 {
			add.WriteString("\n")
		}
		add.WriteString(s.String())
	}
	spans, err := sectionsOf(doc)
	if err != nil {
		return "", err
	}
	at := -1
	if len(spans) > 0 {
		at = spans[len(spans)-1].end
	} else {
		at = resultsEnd(doc)
	}
	if at < 0 {
		return paragraphEnd(doc) + "## Results\n\n" + add.String(), nil
	}
	rest := doc[at:]
	if rest != "" {
		rest = "\n" + strings.TrimLeft(rest, "\n")
	}
	return paragraphEnd(doc[:at]) + add.String() + rest, nil
}

func indexOf(spans []span, name string) int {
	for i, s := range spans {
		if s.name == name {
			return i
		}
	}
	return -1
}

// resultsEnd is the offset where the "## Results" part of doc ends (the next
// heading of its level or above, or the end of doc), or -1 without one.
func resultsEnd(doc string) int {
	in, off := false, 0
	for line := range strings.Lines(doc) {
		h := strings.TrimRight(line, " \t\r\n")
		switch {
		case h == "## Results":
			in = true
		case in && (strings.HasPrefix(h, "# ") || strings.HasPrefix(h, "## ")):
			return off
		}
		off += len(line)
	}
	if in {
		return len(doc)
	}
	return -1
}

// paragraphEnd is s ended by a blank line, so that what follows starts a block of
// its own; the empty string stays empty.
func paragraphEnd(s string) string {
	switch {
	case s == "" || strings.HasSuffix(s, "\n\n"):
		return s
	case strings.HasSuffix(s, "\n"):
		return s + "\n"
	default:
		return s + "\n\n"
	}
}

// spliceFile splices sections into the Markdown file at path, a new one if there is
// none, and replaces it atomically: an interrupted write leaves the old file.
func spliceFile(path string, sections []section) error {
	doc, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	out, err := splice(string(doc), sections)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(vfs.Default, abs, []byte(out))
}

// writeMarkdown puts the sections of the scenarios run where -markdown says: a
// scenario process of a suite writes them to its part file, for the suite to
// splice; a run of its own splices them into the file.
func (c config) writeMarkdown(sections []section) error {
	switch {
	case len(sections) == 0:
		return nil
	case c.markdownPart != "":
		var b strings.Builder
		for _, s := range sections {
			b.WriteString(s.String())
		}
		return os.WriteFile(c.markdownPart, []byte(b.String()), 0o644)
	case c.markdown != "":
		return spliceFile(c.markdown, sections)
	}
	return nil
}
