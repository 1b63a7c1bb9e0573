// Package buildinfo says where the binary came from: its version, the
// commit it was built from and that commit's date.
package buildinfo

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X github.com/idemproxy/idemproxy/internal/app/buildinfo.version=...". Left
// at "dev", it is taken from the build information: the module's version
// when installed with go install, or the version go build derives from
// the git checkout.
var version = "dev"

// Info is what -version prints: where the binary came from.
type Info struct {
	Version  string // the module's version, or "dev"
	Commit   string // vcs.revision: the commit it was built from, "" when unknown
	Time     string // vcs.time: the time of that commit (RFC 3339)
	Modified bool   // vcs.modified: built with uncommitted changes
	Go       string
}

// Read returns the version, commit and date that the Go tool
// embedded in the binary.
func Read() Info {
	b := Info{Version: version, Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if b.Version == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		b.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

func init() { version = Read().Version }

// Version is the binary's version: the one set at build time, else the
// module's, else the one go build derived from the git checkout, else
// "dev".
func Version() string { return version }

// Print writes -version's answer: the version on the first line,
// then the commit, its date and the Go release, one per line.
func Print(w io.Writer) { b := Read(); b.Print(w) }

// NoCommit is what -version says of the commit when the binary carries no
// VCS stamp: all that is known is the stamp's absence, which a build
// outside a git checkout and one with -buildvcs=false (as GOFLAGS, or a
// build from a source tarball) leave alike.
const NoCommit = "unknown: the build carried no VCS stamp (built outside a git checkout, or with -buildvcs=false)"

// Print writes b as -version's answer (see the package's Print).
func (b Info) Print(w io.Writer) {
	fmt.Fprintf(w, "idemproxy %s\n", b.Version)
	commit := b.Commit
	switch {
	case commit == "":
		commit = NoCommit
	case b.Modified:
		commit += " (with uncommitted changes)"
	}
	fmt.Fprintf(w, "commit:  %s\n", commit)
	if b.Time != "" {
		fmt.Fprintf(w, "date:    %s (of the commit)\n", b.Time)
	}
	fmt.Fprintf(w, "go:      %s\n", b.Go)
}
