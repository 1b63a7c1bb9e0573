package doctest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idemproxy/idemproxy/internal/testenv/doctest"
)

// read returns the file (a path from the repository's root) as a string.
func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(doctest.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docPages returns the Markdown pages a reader follows: the README, the
// pages under docs/ and the other READMEs, and CONTRIBUTING.md; not the
// CHANGELOG, which keeps what earlier releases said.
func docPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md", "CONTRIBUTING.md", "deploy/README.md", "upstream-stub/README.md"}
	docs, err := filepath.Glob(doctest.Path(t, "docs/*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	for _, d := range docs {
		pages = append(pages, "docs/"+filepath.Base(d))
	}
	return pages
}

// goModVersion returns the version of go.mod's go directive.
func goModVersion(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(read(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return m[1]
}

// TestREADMEStatesTheGoVersionOfGoMod: the README's Install says which Go
// builds the module, and it is the go directive of go.mod (1.26 for
// "go 1.26.0"); any other page that names a Go version names the same.
func TestREADMEStatesTheGoVersionOfGoMod(t *testing.T) {
	mod := goModVersion(t)
	short := strings.TrimSuffix(mod, ".0")
	goVersion := regexp.MustCompile(`\bGo (1\.\d+(?:\.\d+)?)\b`)
	if got := goVersion.FindAllStringSubmatch(doctest.Section(t, "README.md", "## Install"), -1); len(got) == 0 {
		t.Errorf("README.md, ## Install: no Go version stated (want Go %s, go.mod's go directive)", short)
	}
	for _, page := range docPages(t) {
		for _, m := range goVersion.FindAllStringSubmatch(read(t, page), -1) {
			if m[1] != short && m[1] != mod {
				t.Errorf("%s says Go %s, go.mod's go directive is %s: say Go %s", page, m[1], mod, short)
			}
		}
	}
}

// TestNoDocInstallsTheModuleByName: the module is not published, so a
// page that tells the reader to go install it by its path (…@latest, or
// any version) sends them into an error; they build it from the clone.
func TestNoDocInstallsTheModuleByName(t *testing.T) {
	byName := regexp.MustCompile(`go\s+install\s+(?:-\S+\s+)*github\.com/idemproxy/idemproxy\S*@\S*`)
	for _, page := range docPages(t) {
		for _, m := range byName.FindAllString(read(t, page), -1) {
			t.Errorf("%s says %q: the module is not published; install from a clone (go install . or go build -o idemproxy .)", page, m)
		}
	}
}

// k8sContainer is the part of a container of a manifest the sizing is
// about.
type k8sContainer struct {
	Name string `yaml:"name"`
	Env  []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

// k8sDoc is one document of a manifest: a ConfigMap or a Deployment.
type k8sDoc struct {
	Kind string            `yaml:"kind"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec struct {
				InitContainers []k8sContainer `yaml:"initContainers"`
				Containers     []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// manifest reads the files' documents and returns the kind of store their
// ConfigMap's config.yaml selects and the idemproxy container of their
// Deployment, the later files' fields over the earlier ones' (as a
// strategic-merge patch applies to the base).
func manifest(t *testing.T, files ...string) (store string, c k8sContainer) {
	t.Helper()
	c.Resources.Requests, c.Resources.Limits = map[string]string{}, map[string]string{}
	found := false
	for _, f := range files {
		for _, text := range strings.Split(read(t, f), "\n---\n") {
			var doc k8sDoc
			if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if cfg, ok := doc.Data["config.yaml"]; ok && doc.Kind == "ConfigMap" {
				var y struct {
					Store map[string]any `yaml:"store"`
				}
				if err := yaml.Unmarshal([]byte(cfg), &y); err != nil {
					t.Fatalf("%s, config.yaml: %v", f, err)
				}
				for _, kind := range []string{"badger", "redis", "postgres"} {
					if _, ok := y.Store[kind]; ok {
						store = kind
					}
				}
			}
			if doc.Kind != "Deployment" {
				continue
			}
			for _, p := range append(doc.Spec.Template.Spec.InitContainers, doc.Spec.Template.Spec.Containers...) {
				if p.Name != "idemproxy" {
					continue
				}
				found = true
				c.Name = p.Name
				c.Env = append(c.Env, p.Env...)
				for k, v := range p.Resources.Requests {
					c.Resources.Requests[k] = v
				}
				for k, v := range p.Resources.Limits {
					c.Resources.Limits[k] = v
				}
			}
		}
	}
	if !found {
		t.Fatalf("%s: no idemproxy container in a Deployment", files)
	}
	if store == "" {
		t.Fatalf("%s: no ConfigMap whose config.yaml selects a store", files)
	}
	return store, c
}

// sizingRows returns a Markdown table's memory request and limit by the
// first word of the row's first cell ("Badger", "Redis"), in Kubernetes'
// units ("128 MiB" is "128Mi").
func sizingRows(t *testing.T, file, heading string) map[string][2]string {
	t.Helper()
	rows := map[string][2]string{}
	var header []string
	for _, line := range strings.Split(doctest.Section(t, file, heading), "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if header == nil {
			header = cells
			continue
		}
		req, lim := slices.Index(header, "memory request"), slices.Index(header, "memory limit")
		if req < 0 || lim < 0 {
			t.Fatalf("%s, %s: the table has no memory request and memory limit columns: %q", file, heading, header)
		}
		if strings.HasPrefix(cells[0], "---") || cells[req] == "" {
			continue
		}
		k8s := func(s string) string { return strings.Replace(s, " MiB", "Mi", 1) }
		rows[strings.Fields(cells[0])[0]] = [2]string{k8s(cells[req]), k8s(cells[lim])}
	}
	return rows
}

// TestKubernetesMemoryIsTheSizingTable: the Kubernetes example's idemproxy
// container, the Deployment alone (Badger) and with each store component's
// patch (Redis, PostgreSQL), asks for the memory request and limit of
// docs/operations.md's sizing table, the one source the README repeats;
// and, as the table says, sets no GOMEMLIMIT (the proxy derives its soft
// limit from the container's).
func TestKubernetesMemoryIsTheSizingTable(t *testing.T) {
	const ops, heading = "docs/operations.md", "### Recommended resources"
	table := sizingRows(t, ops, heading)
	if !strings.Contains(doctest.Section(t, ops, heading), "set no `GOMEMLIMIT`") {
		t.Fatalf("%s, %s no longer says to set no GOMEMLIMIT: update this test", ops, heading)
	}
	row := map[string]string{"badger": "Badger", "redis": "Redis", "postgres": "Redis"} // "Redis or PostgreSQL"
	for _, files := range [][]string{
		{"deploy/kubernetes/configmap.yaml", "deploy/kubernetes/deployment.yaml"},
		{"deploy/kubernetes/deployment.yaml", "deploy/kubernetes/redis/redis-store.patch.yaml"},
		{"deploy/kubernetes/deployment.yaml", "deploy/kubernetes/postgres/postgres-store.patch.yaml"},
	} {
		store, c := manifest(t, files...)
		want, ok := table[row[store]]
		if !ok {
			t.Fatalf("%s, %s: no row for %s (%q)", ops, heading, store, row[store])
		}
		got := [2]string{c.Resources.Requests["memory"], c.Resources.Limits["memory"]}
		if got != want {
			t.Errorf("%s (store %s): memory request and limit %q, the sizing table of %s says %q", files[len(files)-1], store, got, ops, want)
		}
		for _, e := range c.Env {
			if e.Name == "GOMEMLIMIT" {
				t.Errorf("%s (store %s) sets GOMEMLIMIT=%s; %s says to set none", files[len(files)-1], store, e.Value, ops)
			}
		}
	}
	// The README repeats the table.
	readme := sizingRows(t, "README.md", "## Memory and limits")
	for name, want := range table {
		if got, ok := readme[name]; ok && got != want {
			t.Errorf("README.md, ## Memory and limits: %s %q, %s says %q", name, got, ops, want)
		}
	}
	for _, name := range []string{"Badger", "Redis"} {
		if _, ok := readme[name]; !ok {
			t.Errorf("README.md, ## Memory and limits: no row for %s", name)
		}
	}
}

// memFigure is a memory size as the docs write one: "58 MiB", "75 to 80
// MiB", "24 KiB".
const memFigure = `\d[\d,.]*(?:\s+to\s+\d[\d,.]*)?\s+[KMG]iB`

var (
	// figureStatedAfter finds a figure that follows a word saying it is a
	// peak: "peak RSS 61 to 62 MiB", "peaked at 121 MiB", "peaks (75 to
	// 80 MiB", "peak RSS (VmHWM) of 86 to 111 MiB".
	figureStatedAfter = regexp.MustCompile(`(?i)\bpeak(?:s|ed)?(?:\s+RSS)?(?:\s+\(VmHWM\))?(?:\s+(?:of|at|to|was|is))?(?:\s+about)?\s+\(?(` + memFigure + `)`)
	// figureStatedBefore finds a figure followed by what it measures:
	// "55 MiB resident", "16 to 24 MiB allocated", "36 MiB on disk", "85
	// MiB at the peak".
	figureStatedBefore = regexp.MustCompile(`(` + memFigure + `)\s+(?:(?:are\s+)?(?:resident|allocated|RSS|on\s+disk)\b|at\s+(?:the|its)\s+peak)`)
	// peaksListed finds the parenthesis of "the measured peaks (75 to 80
	// MiB with …, 24 to 30 MiB with …)": every figure in it is a peak.
	peaksListed = regexp.MustCompile(`(?i)\bpeak(?:s|ed)?\s+\(`)
	figure      = regexp.MustCompile(memFigure)
	spaces      = regexp.MustCompile(`\s+`)
)

// withoutCode returns the Markdown text with its fenced blocks blanked
// (the raw output of a run, not a statement), keeping the line numbers.
func withoutCode(text string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			b.WriteString("\n")
			continue
		}
		if in {
			b.WriteString("\n")
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

// TestMemoryFiguresComeFromOneTable: every peak, resident or allocated
// memory size that the README, the pages under docs/ and the Kubernetes
// example's comments state is one of the figures of the table in
// docs/operations.md, "### Memory: the measurements", their one source. A
// figure changed in one place and not in the table, or in the table and
// not where it is repeated, fails here.
func TestMemoryFiguresComeFromOneTable(t *testing.T) {
	const ops, heading = "docs/operations.md", "### Memory: the measurements"
	source := map[string]bool{}
	var tableLines []string
	inTable := false
	for _, line := range strings.Split(doctest.Section(t, ops, heading), "\n") {
		if strings.HasPrefix(line, "| what | figure | measured with |") {
			inTable = true
		}
		if inTable && !strings.HasPrefix(line, "|") {
			break
		}
		if !inTable {
			continue
		}
		tableLines = append(tableLines, line)
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("%s, %s: the figures' row %q has not 3 cells", ops, heading, line)
		}
		for _, f := range regexp.MustCompile(memFigure).FindAllString(cells[1], -1) {
			source[spaces.ReplaceAllString(f, " ")] = true
		}
	}
	if len(source) < 5 {
		t.Fatalf("%s, %s: no table of the memory figures (| what | figure | measured with |), or almost empty: %v", ops, heading, source)
	}

	places := docPages(t)
	manifests, err := filepath.Glob(doctest.Path(t, "deploy/kubernetes/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(doctest.Path(t, "deploy/kubernetes/*/*.yaml"))
	for _, m := range append(manifests, more...) {
		rel, err := filepath.Rel(doctest.Path(t, "."), m)
		if err != nil {
			t.Fatal(err)
		}
		places = append(places, filepath.ToSlash(rel))
	}
	stated := 0
	for _, place := range places {
		text := read(t, place)
		if strings.HasSuffix(place, ".md") {
			text = withoutCode(text)
		}
		if place == ops {
			for _, line := range tableLines {
				text = strings.Replace(text, line+"\n", "\n", 1)
			}
		}
		// Comments of a manifest wrap lines with "#": read them as prose.
		text = regexp.MustCompile(`\n\s*#`).ReplaceAllString(text, "\n")
		// The figures stated, by their offsets in text (a figure two
		// patterns find is one statement).
		found := map[[2]int]bool{}
		for _, re := range []*regexp.Regexp{figureStatedAfter, figureStatedBefore} {
			for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
				found[[2]int{m[2], m[3]}] = true
			}
		}
		for _, m := range peaksListed.FindAllStringIndex(text, -1) {
			depth, end := 0, m[1]-1
			for ; end < len(text); end++ {
				if text[end] == '(' {
					depth++
				} else if text[end] == ')' {
					if depth--; depth == 0 {
						break
					}
				}
			}
			for _, f := range figure.FindAllStringIndex(text[m[1]:end], -1) {
				found[[2]int{m[1] + f[0], m[1] + f[1]}] = true
			}
		}
		for at := range found {
			stated++
			f := spaces.ReplaceAllString(text[at[0]:at[1]], " ")
			if !source[f] {
				line := strings.Count(text[:at[0]], "\n") + 1
				t.Errorf("%s:%d states %q, which is not a figure of the table in %s, %q: measure it and put it in the table, or repeat the table's figure",
					place, line, f, ops, heading)
			}
		}
	}
	if stated < 5 {
		t.Errorf("only %d memory figures found in the docs: the patterns of this test no longer match how they are written", stated)
	}
}

// TestContributingNamesEveryPackage: CONTRIBUTING.md's map of the code
// (its Layout section) names every package of the module by its folder,
// nested ones (internal/app/cli, internal/testenv/pgtest, store/badger)
// included, so a newcomer who meets one in an import finds it there.
func TestContributingNamesEveryPackage(t *testing.T) {
	layout := doctest.Section(t, "CONTRIBUTING.md", "## Layout")
	_, dirs := moduleImports(t)
	if !slices.Contains(dirs, "internal/app/cli") || !slices.Contains(dirs, "internal/testenv/pgtest") {
		t.Fatalf("the walk found %v: it misses the nested packages", dirs)
	}
	for _, dir := range dirs {
		if dir == "." {
			dir = "main.go"
		}
		named := false
		for _, form := range []string{"`" + dir + "`", "`" + dir + "/`"} {
			named = named || strings.Contains(layout, form)
		}
		if !named {
			t.Errorf("CONTRIBUTING.md's Layout does not name %s (as `%s/`)", dir, dir)
		}
	}
}
