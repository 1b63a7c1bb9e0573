package doctest_test

import (
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is go.mod's module path.
const module = "github.com/idemproxy/idemproxy"

// The module's rooms (CONTRIBUTING.md, Layout): every package is in one of
// them, by its folder from the repository's root.
const (
	roomRoot    = "the composition root" // internal/app and internal/app/...
	roomDomain  = "a domain package"     // domainPackages
	roomLibrary = "a library"            // internal/<lib>
	roomHarness = "a test harness"       // internal/testenv/...
	roomTool    = "a tool"               // toolPackages
)

// domainPackages are the packages at the root that the program is made of.
// leafContracts are the domain packages a library may import: they import
// no domain package but each other, so a library under them stays under
// the proxy, the admin API and the backends.
var (
	domainPackages = []string{"config", "keyextract", "proxy", "admin", "store", "store/badger", "store/redis", "store/postgres", "store/storetest"}
	leafContracts  = []string{"store", "config", "keyextract"}
	storeBackends  = []string{"store/badger", "store/redis", "store/postgres"}
	toolPackages   = []string{".", "bench", "chaos", "chaos/check", "e2e", "upstream-stub", "upstream-stub/stub"}
)

// room says which room the package in folder dir (from the repository's
// root, "." for main) is in, "" for none.
func room(dir string) string {
	switch {
	case dir == "internal/app" || strings.HasPrefix(dir, "internal/app/"):
		return roomRoot
	case dir == "internal/testenv" || strings.HasPrefix(dir, "internal/testenv/"):
		return roomHarness
	case strings.HasPrefix(dir, "internal/"):
		return roomLibrary
	case slices.Contains(domainPackages, dir):
		return roomDomain
	case slices.Contains(toolPackages, dir):
		return roomTool
	}
	return ""
}

// moduleImport is one import of a package of the module, by a non-test file.
type moduleImport struct {
	file string // from the repository's root
	dir  string // the importing package's folder
	imp  string // the imported package's folder
}

// moduleImports returns the imports of the module's packages by its
// non-test Go files (whatever their build constraints), and the folders
// that hold Go files.
func moduleImports(t *testing.T) ([]moduleImport, []string) {
	t.Helper()
	var imports []moduleImport
	dirs := map[string]bool{}
	for _, g := range moduleFiles(t) {
		dirs[g.dir] = true
		if g.test {
			continue
		}
		for _, s := range g.f.Imports {
			ip, _ := strconv.Unquote(s.Path.Value)
			if ip == module {
				imports = append(imports, moduleImport{g.name, g.dir, "."})
			} else if rest, ok := strings.CutPrefix(ip, module+"/"); ok {
				imports = append(imports, moduleImport{g.name, g.dir, rest})
			}
		}
	}
	ds := slices.Collect(maps.Keys(dirs))
	slices.Sort(ds)
	return imports, ds
}

// layerViolation returns why the import breaks the layering, "" if it does
// not.
func layerViolation(m moduleImport) string {
	from, to := room(m.dir), room(m.imp)
	switch {
	case to == roomHarness && from != roomHarness && from != roomTool:
		return "only tests, the tools and the harnesses themselves may import a test harness (internal/testenv/...)"
	case to == roomTool && from != roomTool && from != roomHarness:
		return "a tool is imported by no package of the program"
	case to == roomRoot && from != roomRoot && m.dir != ".":
		return "only main.go and the composition root import the composition root (internal/app/...)"
	case from == roomLibrary && to == roomDomain && !slices.Contains(leafContracts, m.imp):
		return "a library imports no domain package but the leaf contracts (" + strings.Join(leafContracts, ", ") + ")"
	case slices.Contains(leafContracts, m.dir) && to == roomDomain && !slices.Contains(leafContracts, m.imp):
		return "a leaf contract imports no domain package but the other leaf contracts"
	case slices.Contains(storeBackends, m.dir) && (to == roomDomain && m.imp != "store"):
		return "a store backend imports no domain package but the store contract (not proxy, admin or another backend)"
	}
	return ""
}

// TestImportsFollowTheLayers: the module's packages import downwards only
// (CONTRIBUTING.md, Layout): tools and the composition root at the top,
// then the proxy and the admin API, the store backends, the libraries,
// and the leaf contracts (store, config, keyextract) they share; the test
// harnesses beside them, for tests only. Test files may import what their
// tests need.
func TestImportsFollowTheLayers(t *testing.T) {
	imports, dirs := moduleImports(t)
	if len(imports) < 50 {
		t.Fatalf("only %d imports of the module's packages found: the walk missed the tree", len(imports))
	}
	for _, d := range dirs {
		if room(d) == "" {
			t.Errorf("%s is in no room of the layout: add it to the lists of this test and to CONTRIBUTING.md's map", d)
		}
	}
	for _, m := range imports {
		if why := layerViolation(m); why != "" {
			t.Errorf("%s (%s) imports %s (%s): %s", m.file, room(m.dir), path.Join(module, m.imp), room(m.imp), why)
		}
	}
}

// TestLayerRulesCatchEachKindOfImport: each rule of TestImportsFollowTheLayers
// refuses the import it is for, and a permitted import passes.
func TestLayerRulesCatchEachKindOfImport(t *testing.T) {
	for _, tc := range []struct {
		dir, imp string
		want     string // a word of the message, "" for permitted
	}{
		{"proxy", "internal/testenv/proxytest", "test harness"},
		{"internal/settle", "internal/testenv/freeport", "test harness"},
		{"internal/app", "internal/testenv/pgtest", "test harness"},
		{"chaos", "internal/testenv/powerloss", ""},
		{"internal/testenv/proxytest", "proxy", ""},
		{"internal/testenv/proxytest", "upstream-stub/stub", ""},
		{"proxy", "upstream-stub/stub", "tool"},
		{"internal/reconcile", "proxy", "library"},
		{"internal/reconcile", "store/badger", "library"},
		{"internal/reconcile", "store", ""},
		{"internal/admission", "config", ""},
		{"internal/settle", "internal/app/audit", "composition root"},
		{"admin", "internal/app", "composition root"},
		{"proxy", "internal/app/buildinfo", "composition root"},
		{".", "internal/app/cli", ""},
		{"internal/app/cli", "proxy", ""},
		{"store/badger", "proxy", "store backend"},
		{"store/redis", "admin", "store backend"},
		{"store/postgres", "store/badger", "store backend"},
		{"store/badger", "internal/batch", ""},
		{"store", "proxy", "leaf contract"},
		{"config", "keyextract", ""},
	} {
		got := layerViolation(moduleImport{tc.dir + "/x.go", tc.dir, tc.imp})
		if tc.want == "" && got != "" || tc.want != "" && !regexp.MustCompile(`\b`+tc.want+`\b`).MatchString(got) {
			t.Errorf("%s importing %s: got %q, want a message about %q", tc.dir, tc.imp, got, tc.want)
		}
	}
}
