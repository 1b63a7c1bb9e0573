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
// x.Name, and that the exported API of a used one does not expose (a type
// of an exported field, parameter or result, or an underlying type).
func unusedExports(files []goFile) map[string][]string {
	surfaces := exportedSurfaces(files)
	exported := map[string]map[string]bool{} // folder → name → named elsewhere
	for dir, gs := range domainFiles(files) {
		names := map[string]bool{}
		exported[dir] = names
		for _, g := range gs {
			for _, d := range g.f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil && d.Name.IsExported() {
						names[d.Name.Name] = false
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.TypeSpec:
							if s.Name.IsExported() {
								names[s.Name.Name] = false
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								if n.IsExported() {
									names[n.Name] = false
								}
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
	// A type the package's used API exposes is used too, named or not.
	for dir, names := range exported {
		s := surfaces[dir]
		var roots []string
		for name, used := range names {
			if _, ok := deliberateExports[exportID(dir, name)]; used || ok {
				roots = append(roots, name)
			}
		}
		s.walk(roots, func(r typeRef) {
			if _, ok := names[r.name]; ok {
				names[r.name] = true
			}
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
			id := exportID(dir, name)
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

// exportID is how the guards name the top-level identifier name of the
// domain package in folder dir: "config.Config", "store/badger.Open".
func exportID(dir, name string) string {
	if dir != path.Base(dir) {
		return dir + "." + name
	}
	return path.Base(dir) + "." + name
}

// typeRef is a type of the package that a declaration's exported surface
// names.
type typeRef struct {
	name     string // the type, as the package declares it
	at       string // where: "Config.Admin", "NewWriteProbe (result)"
	embedded bool   // an embedded field or interface: its exported parts are promoted, its name is not exposed
}

// surface is a domain package's exported surface as go/parser sees it:
// for each top-level declaration, the package's own types that its
// exported parts name (a type's exported fields, interface methods and
// exported methods; a func's parameters and results; a var's or const's
// declared type).
type surface map[string][]typeRef

// exportedSurfaces returns the surface of each domain package, from its
// non-test files.
func exportedSurfaces(files []goFile) map[string]surface {
	surfaces := map[string]surface{}
	for dir, gs := range domainFiles(files) {
		types := map[string]bool{} // the package's type names
		for _, g := range gs {
			for _, d := range g.f.Decls {
				if d, ok := d.(*ast.GenDecl); ok && d.Tok == token.TYPE {
					for _, s := range d.Specs {
						types[s.(*ast.TypeSpec).Name.Name] = true
					}
				}
			}
		}
		s := surface{}
		surfaces[dir] = s
		add := func(decl, at string, e ast.Expr) {
			s[decl] = appendRefs(s[decl], types, e, at, false)
		}
		for _, g := range gs {
			for _, d := range g.f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					if d.Recv == nil {
						add(d.Name.Name, d.Name.Name, d.Type)
					} else if recv := receiverType(d.Recv.List[0].Type); recv != "" {
						add(recv, recv+"."+d.Name.Name, d.Type)
					}
				case *ast.GenDecl:
					for _, sp := range d.Specs {
						switch sp := sp.(type) {
						case *ast.TypeSpec:
							add(sp.Name.Name, sp.Name.Name, sp.Type)
						case *ast.ValueSpec:
							for _, n := range sp.Names {
								if n.IsExported() && sp.Type != nil {
									add(n.Name, n.Name, sp.Type)
								}
							}
						}
					}
				}
			}
		}
	}
	return surfaces
}

// domainFiles returns the non-test files of each domain package, by its
// folder.
func domainFiles(files []goFile) map[string][]goFile {
	byDir := map[string][]goFile{}
	for _, g := range files {
		if !g.test && slices.Contains(domainPackages, g.dir) {
			byDir[g.dir] = append(byDir[g.dir], g)
		}
	}
	return byDir
}

// receiverType is the name of a method's receiver's type: T of t T, *T,
// T[K] or *T[K].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// appendRefs appends the package's types (types) that the type expression
// e exposes: through pointers, slices, arrays, maps, channels, funcs'
// parameters and results, type arguments, a struct's exported and embedded
// fields, and an interface's methods and embedded interfaces. at says
// where e is.
func appendRefs(refs []typeRef, types map[string]bool, e ast.Expr, at string, embedded bool) []typeRef {
	fields := func(l *ast.FieldList, at string) {
		if l == nil {
			return
		}
		for _, f := range l.List {
			refs = appendRefs(refs, types, f.Type, at, false)
		}
	}
	members := func(l *ast.FieldList) { // a struct's fields or an interface's methods: the exported and the embedded ones
		for _, f := range l.List {
			if len(f.Names) == 0 {
				refs = appendRefs(refs, types, f.Type, at, true)
			}
			for _, n := range f.Names {
				if n.IsExported() {
					refs = appendRefs(refs, types, f.Type, at+"."+n.Name, false)
				}
			}
		}
	}
	in := func(e ast.Expr, embedded bool) { refs = appendRefs(refs, types, e, at, embedded) }
	switch e := e.(type) {
	case *ast.Ident:
		if types[e.Name] {
			refs = append(refs, typeRef{e.Name, at, embedded})
		}
	case *ast.StarExpr:
		in(e.X, embedded)
	case *ast.ParenExpr:
		in(e.X, embedded)
	case *ast.ArrayType:
		in(e.Elt, false)
	case *ast.Ellipsis:
		in(e.Elt, false)
	case *ast.ChanType:
		in(e.Value, false)
	case *ast.MapType:
		in(e.Key, false)
		in(e.Value, false)
	case *ast.IndexExpr:
		in(e.X, embedded)
		in(e.Index, false)
	case *ast.IndexListExpr:
		in(e.X, embedded)
		for _, x := range e.Indices {
			in(x, false)
		}
	case *ast.FuncType:
		if strings.HasSuffix(at, ")") { // a func in a func's signature: where the outer one is
			fields(e.Params, at)
			fields(e.Results, at)
			break
		}
		fields(e.Params, at+" (parameter)")
		fields(e.Results, at+" (result)")
	case *ast.StructType:
		members(e.Fields)
	case *ast.InterfaceType:
		members(e.Methods)
	}
	return refs
}

// walk calls visit for each type reachable from the declarations roots
// through their surfaces, each once, by the first way found to it.
func (s surface) walk(roots []string, visit func(typeRef)) {
	slices.Sort(roots)
	seen := map[string]bool{}
	var from func(decl string)
	from = func(decl string) {
		for _, r := range s[decl] {
			if seen[r.name] {
				continue
			}
			seen[r.name] = true
			visit(r)
			from(r.name)
		}
	}
	for _, d := range roots {
		seen[d] = true
	}
	for _, d := range roots {
		from(d)
	}
}

// TestDomainPackagesExposeNoUnexportedType: an exported field, parameter
// or result of a domain package, or an exported type's underlying type,
// names only exported types (through pointers, slices, maps, funcs): a
// value of a type its users cannot name hides its documentation from go
// doc, and linters flag it (revive's unexported-return). A type exposed so
// counts as used for TestDomainPackagesExportOnlyWhatIsUsed.
func TestDomainPackagesExposeNoUnexportedType(t *testing.T) {
	surfaces := exportedSurfaces(moduleFiles(t))
	if len(surfaces) < len(domainPackages) {
		t.Fatalf("found %d of the %d domain packages: the walk missed the tree", len(surfaces), len(domainPackages))
	}
	for _, dir := range domainPackages {
		for _, r := range surfaces[dir].unexported() {
			t.Errorf("%s names %s, which is unexported: export the type (its doc comment's first word too)", exportID(dir, r.at), exportID(dir, r.name))
		}
	}
}

// unexported returns the unexported types the package's exported
// declarations expose, but for embedded ones (whose exported parts are
// followed).
func (s surface) unexported() []typeRef {
	var roots []string
	for decl := range s {
		if ast.IsExported(decl) {
			roots = append(roots, decl)
		}
	}
	var refs []typeRef
	s.walk(roots, func(r typeRef) {
		if !r.embedded && !ast.IsExported(r.name) {
			refs = append(refs, r)
		}
	})
	return refs
}

// TestExposureRulesCatchEachKindOfPlace: each place where
// TestDomainPackagesExposeNoUnexportedType looks finds an unexported
// type, and the places an unexported type may stand pass.
func TestExposureRulesCatchEachKindOfPlace(t *testing.T) {
	const src = `package proxy

type Outer struct {
	inner             // embedded: promoted, not exposed by name
	Field  *field     // an exported field, through a pointer
	priv   unused     // an unexported field
	Nested []map[key]chan elem
}

type inner struct{ Promoted promoted }

func New(p param, more ...variadic) (fn func() funcResult, err error) { return nil, nil }

func (Outer) Method() methodResult { return 0 }

func (unused) Method() unusedResult { return 0 } // an unexported type's method

func helper() unusedResult { return 0 }

type Iface interface {
	Get() ifaceResult
	embeddedIface
}

type embeddedIface interface{ Promoted() viaEmbedded }

var V varType

const C constType = 0

type Named underlying

type Gen[T any] struct{ X T }

func G() Gen[typeArg] { return Gen[typeArg]{} }

type Alias = aliased

type (
	field int
	key int
	elem int
	promoted int
	param int
	variadic int
	funcResult int
	methodResult int
	unused int
	unusedResult int
	ifaceResult int
	viaEmbedded int
	varType int
	constType int
	underlying int
	typeArg int
	aliased int
)
`
	f, err := parser.ParseFile(token.NewFileSet(), "proxy/x.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range exportedSurfaces([]goFile{{"proxy/x.go", "proxy", false, f}})["proxy"].unexported() {
		got = append(got, r.name+" at "+r.at)
	}
	slices.Sort(got)
	want := []string{
		"aliased at Alias",
		"constType at C",
		"elem at Outer.Nested",
		"field at Outer.Field",
		"funcResult at New (result)",
		"ifaceResult at Iface.Get (result)",
		"key at Outer.Nested",
		"methodResult at Outer.Method (result)",
		"param at New (parameter)",
		"promoted at inner.Promoted",
		"typeArg at G (result)",
		"underlying at Named",
		"varType at V",
		"variadic at New (parameter)",
		"viaEmbedded at embeddedIface.Promoted (result)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("found\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// TestExposedTypeCountsAsUsed: a type that a used export exposes counts as
// used though no other package names it; one only an unused export
// exposes does not.
func TestExposedTypeCountsAsUsed(t *testing.T) {
	var files []goFile
	for _, src := range []struct{ name, text string }{
		{"proxy/x.go", "package proxy\n\ntype Proxy struct{ Options *Options }\n\ntype Options struct{ Metrics Metrics }\n\ntype Metrics struct{}\n\nfunc Unused() Report { return Report{} }\n\ntype Report struct{}\n"},
		{"internal/app/x.go", "package app\n\nimport \"" + module + "/proxy\"\n\nvar _ proxy.Proxy\n"},
	} {
		f, err := parser.ParseFile(token.NewFileSet(), src.name, src.text, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, goFile{src.name, path.Dir(src.name), false, f})
	}
	if got, want := unusedExports(files)["proxy"], []string{"Report", "Unused"}; !slices.Equal(got, want) {
		t.Errorf("unused exports of proxy: got %v, want %v", got, want)
	}
}
