// Package codesize_test holds the size limits of issue 20 as a test: in the service packages (deliver and every
// package below it, internal, offsets, config, levels, contract) no non-test Go file is over [maxLines] lines and no
// struct type has more than [maxFields] field names (an embedded field counts as one name).
//
// Today's code breaks both limits, so the test takes an explicit allow-list, [known], of today's violations with their
// current sizes. It fails on a violation that is not listed, on a listed one that grew, on a listed one that shrank
// (lower its entry to its new size) and on a listed one that is now within its limit (delete its entry): each entry is
// pinned to its current size, so nothing can grow back unnoticed. The reshape of issue 20 shrinks the list;
// when it is empty the limits hold everywhere, and the list stays empty.
//
// Two more checks of the reshape's shape live here: [TestPackagesApart] fails when the router's package and the
// level owner's import each other (either way, directly or through another package of the module), and
// [TestLongFunctions] logs every non-test function of the service packages over [longFunc] lines (a report for
// the notes, never a failure).
package codesize_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const (
	maxLines  = 600 // lines of a non-test Go file
	maxFields = 20  // field names of a struct type
)

// servicePackages are the directories checked, relative to the module root, each with every package below it.
var servicePackages = []string{"deliver", "internal", "offsets", "config", "levels", "contract"}

// known lists today's violations and their sizes: a file by its path ("deliver/router.go", lines) or a struct by its
// directory and type name ("deliver.Router", field names). Each entry is the current size: entries may only shrink
// (with the code) or go; see the package comment.
var known = map[string]int{}

// violation is a file over maxLines or a struct over maxFields.
type violation struct {
	key   string // as in known
	size  int
	limit int
	what  string // "lines" or "fields"
	at    string // file:line
}

// eachFile parses every non-test Go file of the service packages under root and calls fn with its path from root
// (slash-separated) and its syntax tree.
func eachFile(t *testing.T, root string, fset *token.FileSet, fn func(rel string, f *ast.File)) {
	t.Helper()
	for _, dir := range servicePackages {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if name := d.Name(); name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			fn(filepath.ToSlash(rel), f)
			return nil
		})
		if err != nil {
			t.Fatalf("walking %s: %v", dir, err)
		}
	}
}

// measure returns every violation in the service packages under root.
func measure(t *testing.T, root string) []violation {
	t.Helper()
	var out []violation
	fset := token.NewFileSet()
	eachFile(t, root, fset, func(rel string, f *ast.File) {
		if n := fset.File(f.Pos()).LineCount(); n > maxLines {
			out = append(out, violation{key: rel, size: n, limit: maxLines, what: "lines", at: rel})
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			names := 0
			for _, fl := range st.Fields.List {
				names += max(len(fl.Names), 1) // an embedded field is one name
			}
			if names > maxFields {
				out = append(out, violation{key: filepath.ToSlash(filepath.Dir(rel)) + "." + ts.Name.Name, size: names,
					limit: maxFields, what: "fields", at: fmt.Sprintf("%s:%d", rel, fset.Position(ts.Pos()).Line)})
			}
			return true
		})
	})
	return out
}

// moduleRoot returns the directory holding go.mod, two levels up from this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	return root
}

// TestSizeLimits fails on a file or struct over its limit that known does not list, or whose size is not its entry's
// (grown: shrink it; shrunk: lower the entry), and on an entry of known that is now within its limit.
func TestSizeLimits(t *testing.T) {
	t.Parallel()
	vs := measure(t, moduleRoot(t))
	sort.Slice(vs, func(i, j int) bool { return vs[i].key < vs[j].key })
	seen := map[string]bool{}
	for _, v := range vs {
		seen[v.key] = true
		allowed, ok := known[v.key]
		switch {
		case !ok:
			t.Errorf("%s: %s has %d %s, over the limit of %d (issue 20): split it", v.at, v.key, v.size, v.what, v.limit)
		case v.size > allowed:
			t.Errorf("%s: %s has %d %s, more than the %d it is allowed while issue 20's reshape shrinks it (limit %d)",
				v.at, v.key, v.size, v.what, allowed, v.limit)
		case v.size < allowed:
			t.Errorf("%s: %s is down to %d %s from %d: lower its entry in known to %d, so it cannot grow back",
				v.at, v.key, v.size, v.what, allowed, v.size)
		}
	}
	for key := range known {
		if !seen[key] {
			t.Errorf("%s is within its limit now (or gone): delete its entry from known, so it cannot grow back", key)
		}
	}
}
