package redis

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain runs the tests under testrun's supervisor: they start redis-
// server, which must not outlive the test binary, even when it is killed.
// Each test starts its own servers and then mostly waits on them (for
// replicas, failovers, WAIT timeouts), so up to 4 run at once unless
// -parallel was given.
func TestMain(m *testing.M) { testrun.MainParallel(m, 4) }
