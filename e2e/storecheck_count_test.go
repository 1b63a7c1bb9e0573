package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/internal/app/cli"
	"github.com/idemproxy/idemproxy/store/badger"
)

// TestQuarantineCountsRecordsSetAside: the count of records
// `idemproxy store quarantine` sets aside (stdout and the audit line's
// records_set_aside) is what the operator checks with the upstream: every
// valid record after the damage, which Check counts (Report.SetAside). It
// was computed as the records before the damage minus those kept, which
// are the same records: always 0.
func TestQuarantineCountsRecordsSetAside(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	badgerWithCharges(t, data, 300)
	cfg := writeConfig(t, filepath.Join(dir, "c.yaml"), "http://127.0.0.1:9", data, "", chargesRoute)
	damageStoreLog(t, data)
	rep, err := badger.Check(data)
	if err != nil || rep.OK() || rep.SetAside == 0 {
		t.Fatalf("Check = %+v, %v; want damage with records after it", rep, err)
	}
	var stdout, stderr bytes.Buffer
	getenv := func(string) string { return "" }
	if code := cli.Run(context.Background(), []string{"store", "quarantine", "-config", cfg, "-operator", "o", "-reason", "r"}, &stdout, &stderr, getenv); code != 0 {
		t.Fatalf("exit %d; stdout:\n%s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	var audit map[string]any
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "quarantined by an operator") {
			json.Unmarshal([]byte(line), &audit)
		}
	}
	if got := audit["records_set_aside"]; got != float64(rep.SetAside) {
		t.Errorf("audit records_set_aside = %v, want %d (the valid records after the damage, moved aside)\nstdout:\n%s", got, rep.SetAside, stdout.String())
	}
}
