package postgres_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain runs up to 4 tests at once unless -parallel was given: each
// test starts its own PostgreSQL cluster and then mostly waits (for the
// server to start, for outages, timeouts and standbys), so running more of
// them at once shortens the package's wall time even on 2 cores.
//
// The tests run under testrun's supervisor, so that no PostgreSQL server
// outlives the test binary, even when it is killed.
func TestMain(m *testing.M) { testrun.MainParallel(m, 4) }
