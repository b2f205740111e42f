package codesize_test

import (
	"bufio"
	"errors"
	"go/build"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// apart are the pairs of service packages (directories from the module root) that must not import each other,
// either way, directly or through other packages of the module: the router and the level owner each declare the
// small interface they need of the other, and deliver wires them together (issue 20).
var apart = [][2]string{{"deliver/internal/routing", "deliver/internal/level"}}

// modulePath returns the module path go.mod under root declares.
func modulePath(t *testing.T, root string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(p), `"`)
		}
	}
	t.Fatalf("go.mod under %s declares no module (%v)", root, sc.Err())
	return ""
}

// importGraph reads the imports of the module's packages under root, by directory from the root: the imports of a
// package's non-test files, and with tests those of its test files too (in package and external), each within the
// module only. Files of every build tag the repository uses (long, gray) are read.
type importGraph struct {
	root, module string
	ctx          build.Context
	code, tests  map[string][]string // directory -> module directories it imports
}

func newImportGraph(t *testing.T, root string) *importGraph {
	ctx := build.Default
	ctx.BuildTags = append(slices.Clone(ctx.BuildTags), "long", "gray")
	return &importGraph{root: root, module: modulePath(t, root), ctx: ctx, code: map[string][]string{}, tests: map[string][]string{}}
}

// read fills g.code and g.tests for dir.
func (g *importGraph) read(t *testing.T, dir string) {
	t.Helper()
	if _, ok := g.code[dir]; ok {
		return
	}
	p, err := g.ctx.ImportDir(filepath.Join(g.root, filepath.FromSlash(dir)), 0)
	var none *build.NoGoError
	if err != nil && !errors.As(err, &none) {
		t.Fatalf("reading package %s: %v", dir, err)
	}
	local := func(imports []string) []string {
		var out []string
		for _, imp := range imports {
			if rel, ok := strings.CutPrefix(imp, g.module+"/"); ok {
				out = append(out, rel)
			}
		}
		return out
	}
	g.code[dir] = local(p.Imports)
	g.tests[dir] = local(append(slices.Clone(p.TestImports), p.XTestImports...))
}

// chain returns a chain of imports from dir to target ("a -> b -> target"), or "" if dir's code (and, with tests, its
// test files) reaches no import of target. Beyond dir's own files only non-test code counts: tests are not imported.
func (g *importGraph) chain(t *testing.T, dir, target string, tests bool) string {
	t.Helper()
	g.read(t, dir)
	from := g.code[dir]
	if tests {
		from = append(slices.Clone(from), g.tests[dir]...)
	}
	seen := map[string]bool{dir: true}
	type step struct{ dir, chain string }
	var queue []step
	for _, d := range from {
		queue = append(queue, step{d, dir + " -> " + d})
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if s.dir == target || strings.HasPrefix(s.dir, target+"/") {
			return s.chain
		}
		if seen[s.dir] {
			continue
		}
		seen[s.dir] = true
		g.read(t, s.dir)
		for _, d := range g.code[s.dir] {
			queue = append(queue, step{d, s.chain + " -> " + d})
		}
	}
	return ""
}

// TestPackagesApart fails when one package of a pair in apart imports the other, or a package of the module that
// does (directly or further), in its code or its tests.
func TestPackagesApart(t *testing.T) {
	t.Parallel()
	g := newImportGraph(t, moduleRoot(t))
	for _, pair := range apart {
		for _, way := range [][2]string{pair, {pair[1], pair[0]}} {
			if chain := g.chain(t, way[0], way[1], true); chain != "" {
				t.Errorf("%s imports %s (%s): the two must not depend on each other; deliver wires them",
					path.Base(way[0]), path.Base(way[1]), chain)
			}
		}
	}
}
