package doctest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/doctest"
)

// deliberateExports are the exported top-level identifiers of the domain
// packages that no other package of the module names, kept on purpose,
// each with its reason (CONTRIBUTING.md, Public API).
var deliberateExports = map[string]string{}

// goFile is one parsed Go file of the module.
type goFile struct {
	name string // the file's path from the repository's root
	dir  string // the package's folder from the repository's root
	test bool   // a _test.go file
	f    *ast.File
}

// moduleFiles parses every Go file of the module, tests included, whatever
// its build constraints.
func moduleFiles(t *testing.T) []goFile {
	t.Helper()
	root := doctest.Path(t, ".")
	fset := token.NewFileSet()
	var files []goFile
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		files = append(files, goFile{rel, path.Dir(rel), strings.HasSuffix(name, "_test.go"), f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// unusedExports returns, for each domain package, the exported top-level
// identifiers of its non-test files that no other package (another
// folder, or the package's own external tests, package x_test) names as
// x.Name.
func unusedExports(files []goFile) map[string][]string {
	exported := map[string]map[string]bool{} // folder → name → named elsewhere
	for _, g := range files {
		if g.test || !slices.Contains(domainPackages, g.dir) {
			continue
		}
		if exported[g.dir] == nil {
			exported[g.dir] = map[string]bool{}
		}
		for _, d := range g.f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					exported[g.dir][d.Name.Name] = false
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							exported[g.dir][s.Name.Name] = false
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								exported[g.dir][n.Name] = false
							}
						}
					}
				}
			}
		}
	}
	for _, g := range files {
		own := g.f.Name.Name
		local := map[string]string{} // the file's name of a domain package → its folder
		for _, s := range g.f.Imports {
			ip, _ := strconv.Unquote(s.Path.Value)
			dir, ok := strings.CutPrefix(ip, module+"/")
			if !ok || exported[dir] == nil || dir == g.dir && !strings.HasSuffix(own, "_test") {
				continue
			}
			name := path.Base(dir)
			if s.Name != nil {
				name = s.Name.Name
			}
			local[name] = dir
		}
		if len(local) == 0 {
			continue
		}
		ast.Inspect(g.f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok {
					if dir, ok := local[x.Name]; ok {
						if _, ok := exported[dir][sel.Sel.Name]; ok {
							exported[dir][sel.Sel.Name] = true
						}
					}
				}
			}
			return true
		})
	}
	unused := map[string][]string{}
	for dir, names := range exported {
		for name, used := range names {
			if !used {
				unused[dir] = append(unused[dir], name)
			}
		}
		slices.Sort(unused[dir])
	}
	return unused
}

// TestDomainPackagesExportOnlyWhatIsUsed: the module is a program, so a
// domain package exports only what another package of it uses (its own
// external tests count), and the store contract's deliberate exports
// (CONTRIBUTING.md, Public API). An export nobody uses says a caller
// relies on it when none does: unexport it, or allow it here with the
// reason.
func TestDomainPackagesExportOnlyWhatIsUsed(t *testing.T) {
	files := moduleFiles(t)
	unused := unusedExports(files)
	if len(unused) == 0 && len(files) < 100 {
		t.Fatalf("only %d Go files found: the walk missed the tree", len(files))
	}
	allowed := map[string]bool{}
	for _, dir := range domainPackages {
		for _, name := range unused[dir] {
			id := path.Base(dir) + "." + name
			if dir != path.Base(dir) {
				id = dir + "." + name
			}
			if _, ok := deliberateExports[id]; ok {
				allowed[id] = true
				continue
			}
			t.Errorf("%s is exported and no other package of the module names it: unexport it, or add it to deliberateExports with the reason", id)
		}
	}
	for id := range deliberateExports {
		if !allowed[id] {
			t.Errorf("deliberateExports lists %s, which does not exist or another package now names: drop it from the list", id)
		}
	}
}
