package proxy

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEListsEveryStoreOperation: every operation label value of the
// store metrics is in the README's row for them.
func TestREADMEListsEveryStoreOperation(t *testing.T) {
	b, err := os.ReadFile("../README.md")
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
		t.Fatal("the README's Metrics table has no row for idemproxy_store_operation_duration_seconds")
	}
	for _, op := range storeOperations {
		if !strings.Contains(row, "`"+op+"`") {
			t.Errorf("the README's row for the store metrics does not list the operation %q", op)
		}
	}
}
