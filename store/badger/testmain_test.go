package badger

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain runs the tests under testrun's supervisor: they mount file
// systems and run child processes, which must not outlive the test binary,
// even when it is killed. Up to 4 run at once unless -parallel was given:
// with synced writes they wait on fsync more than they compute.
func TestMain(m *testing.M) { testrun.MainParallel(m, 4) }
