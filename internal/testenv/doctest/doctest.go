// Package doctest reads the repository's Markdown documents for the tests
// that keep them in step with the code. It is used by tests only.
package doctest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Path returns name, a path relative to the repository's root (the
// directory that holds go.mod), as a path from the test's working
// directory, wherever in the repository the test runs.
func Path(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for up := "."; ; up = filepath.Join(up, "..") {
		if _, err := os.Stat(filepath.Join(dir, up, "go.mod")); err == nil {
			return filepath.Join(up, name)
		}
		if abs, _ := filepath.Abs(filepath.Join(dir, up)); abs == filepath.Dir(abs) {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}

// Section returns the text of the Markdown file (a path relative to the
// repository's root, as README.md or docs/operations.md) from heading to
// the next heading of the same level. The test fails if there is no such
// heading.
func Section(t testing.TB, file, heading string) string {
	t.Helper()
	b, err := os.ReadFile(Path(t, file))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q", file, heading)
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	if i := strings.Index(rest, "\n"+level); i >= 0 {
		rest = rest[:i]
	}
	return rest
}
