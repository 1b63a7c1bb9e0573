package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// docFiles are the Markdown pages whose links TestDocLinksResolve checks.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "deploy/README.md", "upstream-stub/README.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append(files, docs...)
}

// fenceRE matches a fenced code block, whose text is not Markdown.
var fenceRE = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")

// linkRE matches an inline link and captures its target.
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchors returns the anchors GitHub gives the headings of a Markdown page:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(fenceRE.ReplaceAllString(text, ""), "\n") {
		h := strings.TrimLeft(line, "#")
		if h == line || !strings.HasPrefix(h, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocLinksResolve: every relative link of the README, CONTRIBUTING,
// CHANGELOG and docs/*.md names a file or directory of the repository that
// exists, and every #anchor into a Markdown page names one of its headings,
// so that a page moved or a heading renamed cannot leave a reader at a
// dead end.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := fenceRE.ReplaceAllString(string(b), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s: the link %s names %s, which does not exist", file, target, resolved)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			page, err := os.ReadFile(resolved)
			if err != nil {
				t.Errorf("%s: the link %s: %v", file, target, err)
				continue
			}
			if !anchors(string(page))[anchor] {
				t.Errorf("%s: the link %s names the anchor #%s, which %s has no heading for", file, target, anchor, resolved)
			}
		}
	}
}
