package buildinfo_test

import (
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/app/buildinfo"
)

// TestPrint pins -version's answer for the builds it meets, among them one
// without a VCS stamp: a build with -buildvcs=false inside a git checkout
// carries none either, so the answer says only that the stamp is missing,
// not where the build ran.
func TestPrint(t *testing.T) {
	tests := []struct {
		name string
		info buildinfo.Info
		want string
	}{
		{
			name: "stamped, clean",
			info: buildinfo.Info{Version: "v1.2.3", Commit: "abc123", Time: "2026-12-04T07:00:00Z", Go: "go1.23.0"},
			want: "idemproxy v1.2.3\ncommit:  abc123\ndate:    2026-12-04T07:00:00Z (of the commit)\ngo:      go1.23.0\n",
		},
		{
			name: "stamped, with uncommitted changes",
			info: buildinfo.Info{Version: "dev", Commit: "abc123", Time: "2026-12-04T07:00:00Z", Modified: true, Go: "go1.23.0"},
			want: "idemproxy dev\ncommit:  abc123 (with uncommitted changes)\ndate:    2026-12-04T07:00:00Z (of the commit)\ngo:      go1.23.0\n",
		},
		{
			name: "no VCS stamp: -buildvcs=false or outside a checkout",
			info: buildinfo.Info{Version: "dev", Go: "go1.23.0"},
			want: "idemproxy dev\ncommit:  unknown: the build carried no VCS stamp (built outside a git checkout, or with -buildvcs=false)\ngo:      go1.23.0\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			tt.info.Print(&b)
			if got := b.String(); got != tt.want {
				t.Errorf("Print =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}
