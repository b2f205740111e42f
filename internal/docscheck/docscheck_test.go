package docscheck

import (
	"bufio"
	"encoding/json"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's root, relative to this package's directory.
const root = "../.."

// citation matches a Markdown page of the repository cited from a Go
// comment, with its optional anchor: docs/guarantees.md#never-early,
// README.md, docs/benchmarks/2026-11-30.md.
var citation = regexp.MustCompile(`(?:^|[^\w/.-])((?:docs/[\w./-]*[\w-]|README|CHANGELOG)\.md)(#[\w-]+)?`)

// mdLink matches an inline Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// htmlAnchor matches an explicit anchor: <a id="x"> or <a name="x">.
var htmlAnchor = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)

// slug is GitHub's anchor for a heading's text: lower case, letters,
// digits, '_' and '-' kept, spaces turned into '-', everything else
// (punctuation, backticks, emphasis) dropped.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r), unicode.IsNumber(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of the Markdown file at p (a path from the
// repository's root): one per heading outside code blocks, a repeated
// heading's with GitHub's "-1", "-2" suffixes, and explicit <a id>s.
func anchors(t *testing.T, p string) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(p)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		if h := strings.TrimLeft(line, "#"); len(h) < len(line) && len(line)-len(h) <= 6 && strings.HasPrefix(h, " ") {
			s := slug(h)
			if n := seen[s]; n > 0 {
				out[s+"-"+itoa(n)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + itoa(n%10)
}

// pages caches the anchors of each Markdown page by its path from the
// root; a page that does not exist maps to nil.
type pages map[string]map[string]bool

func (ps pages) get(t *testing.T, p string) (map[string]bool, bool) {
	if a, ok := ps[p]; ok {
		return a, a != nil
	}
	if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
		ps[p] = nil
		return nil, false
	}
	a := anchors(t, p)
	ps[p] = a
	return a, true
}

// check reports a problem with the citation of page#anchor from where.
func (ps pages) check(t *testing.T, where, page, anchor string) {
	t.Helper()
	a, ok := ps.get(t, page)
	if !ok {
		t.Errorf("%s cites %s, which does not exist", where, page+anchor)
		return
	}
	if anchor != "" && !a[strings.TrimPrefix(anchor, "#")] {
		t.Errorf("%s cites %s%s: %s has no such heading", where, page, anchor, page)
	}
}

// TestCommentCitations: every docs page and heading a Go comment of the
// repository cites exists.
func TestCommentCitations(t *testing.T) {
	ps := pages{}
	n := 0
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				for _, m := range citation.FindAllStringSubmatch(c.Text, -1) {
					pos := fset.Position(c.Pos())
					rel, _ := filepath.Rel(root, pos.Filename)
					ps.check(t, filepath.ToSlash(rel)+":"+itoa(pos.Line), m[1], m[2])
					n++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no Go comment cites a docs page: the walk found nothing to check")
	}
	t.Logf("%d citations checked", n)
}

// deployFiles are the files outside Go and Markdown whose text cites docs
// pages (comments, a dashboard's descriptions), as globs from the root.
var deployFiles = []string{"Dockerfile", "deploy/systemd/*", "deploy/k8s/*.yaml", "deploy/grafana/*.json"}

// TestDeployCitations: every docs page and heading the Dockerfile, the
// systemd unit, the Kubernetes manifests and the Grafana dashboard cite
// exists. A JSON file's strings are checked once decoded, so that a
// citation after an escaped "\n" is found.
func TestDeployCitations(t *testing.T) {
	ps := pages{}
	n := 0
	for _, glob := range deployFiles {
		files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(glob)))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Errorf("%s matches no file: update deployFiles", glob)
		}
		for _, f := range files {
			rel, _ := filepath.Rel(root, f)
			rel = filepath.ToSlash(rel)
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var texts []string // one text per line, or per JSON string
			if strings.HasSuffix(f, ".json") {
				var v any
				if err := json.Unmarshal(data, &v); err != nil {
					t.Fatalf("%s: %v", rel, err)
				}
				texts = jsonStrings(v, nil)
			} else {
				texts = strings.Split(string(data), "\n")
			}
			for i, text := range texts {
				where := rel + ":" + itoa(i+1)
				if strings.HasSuffix(f, ".json") {
					where = rel + " (the string " + strconv.Quote(text[:min(len(text), 60)]) + "…)"
				}
				for _, m := range citation.FindAllStringSubmatch(text, -1) {
					ps.check(t, where, m[1], m[2])
					n++
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no deploy file cites a docs page: the walk found nothing to check")
	}
	t.Logf("%d citations checked", n)
}

// jsonStrings appends every string value of the decoded JSON v to out, in
// no particular order.
func jsonStrings(v any, out []string) []string {
	switch v := v.(type) {
	case string:
		out = append(out, v)
	case []any:
		for _, e := range v {
			out = jsonStrings(e, out)
		}
	case map[string]any:
		for _, e := range v {
			out = jsonStrings(e, out)
		}
	}
	return out
}

// TestMarkdownLinks: every relative link of README.md, CHANGELOG.md and the
// docs/ pages names a file that exists and, for a Markdown page, a heading
// it has.
func TestMarkdownLinks(t *testing.T) {
	ps := pages{}
	files := []string{"README.md", "CHANGELOG.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		fence := false
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				p, anchor, _ := strings.Cut(target, "#")
				if anchor != "" {
					anchor = "#" + anchor
				}
				page := file
				if p != "" {
					page = path.Clean(path.Join(path.Dir(file), p))
				}
				where := file + ":" + itoa(i+1)
				if !strings.HasSuffix(page, ".md") {
					if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(page))); err != nil {
						t.Errorf("%s links to %s, which does not exist", where, target)
					}
					continue
				}
				ps.check(t, where, page, anchor)
			}
		}
	}
}

// TestREADMELength: README.md is the front door, at most READMEMaxLines
// lines; the rest belongs in docs/.
func TestREADMELength(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n > READMEMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail to a page of docs/", n, READMEMaxLines)
	}
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Never early", "never-early"},
		{"Any delay: `Delay-Duration` and `Delay-Deliver-At`", "any-delay-delay-duration-and-delay-deliver-at"},
		{"A step of the server's clock", "a-step-of-the-servers-clock"},
		{"Measured under kill -9", "measured-under-kill--9"},
		{"State in NATS: missing, garbled, from another table", "state-in-nats-missing-garbled-from-another-table"},
		{"Deployment: systemd", "deployment-systemd"},
	} {
		if got := slug(c.in); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
