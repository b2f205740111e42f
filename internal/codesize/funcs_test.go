package codesize_test

import (
	"cmp"
	"fmt"
	"go/ast"
	"go/token"
	"path/filepath"
	"slices"
	"testing"
)

// longFunc is the length that [TestLongFunctions] reports: a function of more lines is hard to read whole (issue
// 20's measure). It is not a limit.
const longFunc = 100

// longFunction is a non-test function or method over longFunc lines.
type longFunction struct {
	name  string // "name", or "Type.name" for a method
	at    string // file:line of its func keyword
	lines int    // from its func keyword to its closing brace
}

// longFunctions returns every function of the service packages under root over longFunc lines, longest first.
func longFunctions(t *testing.T, root string) []longFunction {
	t.Helper()
	var out []longFunction
	fset := token.NewFileSet()
	eachFile(t, root, fset, func(rel string, f *ast.File) {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			from, to := fset.Position(fd.Pos()).Line, fset.Position(fd.End()).Line
			if to-from+1 <= longFunc {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				name = receiverName(fd.Recv.List[0].Type) + "." + name
			}
			out = append(out, longFunction{name: filepath.Base(filepath.Dir(rel)) + "." + name,
				at: fmt.Sprintf("%s:%d", rel, from), lines: to - from + 1})
		}
	})
	slices.SortFunc(out, func(a, b longFunction) int { return cmp.Or(b.lines-a.lines, cmp.Compare(a.at, b.at)) })
	return out
}

// receiverName is a method's receiver type without its pointer and type parameters: "T" for *T and T[K].
func receiverName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return receiverName(x.X)
	case *ast.IndexExpr:
		return receiverName(x.X)
	case *ast.IndexListExpr:
		return receiverName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// TestLongFunctions logs (t.Log, it never fails) every non-test function of the service packages over longFunc
// lines, longest first, for the reshape's notes to quote: go test -v -run TestLongFunctions ./internal/codesize.
func TestLongFunctions(t *testing.T) {
	t.Parallel()
	fs := longFunctions(t, moduleRoot(t))
	for _, f := range fs {
		t.Logf("%s: %s, %d lines", f.at, f.name, f.lines)
	}
	t.Logf("%d non-test functions over %d lines in %v", len(fs), longFunc, servicePackages)
}
