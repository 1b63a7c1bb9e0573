package proxy

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEListsEveryStoreOperation: every operation label value of the
// store metrics is in their row of the Metrics table (docs/operations.md).
func TestREADMEListsEveryStoreOperation(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `idemproxy_store_operation_duration_seconds`") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/operations.md's Metrics table has no row for idemproxy_store_operation_duration_seconds")
	}
	for _, op := range storeOperations {
		if !strings.Contains(row, "`"+op+"`") {
			t.Errorf("docs/operations.md's row for the store metrics does not list the operation %q", op)
		}
	}
}
