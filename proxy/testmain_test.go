package proxy_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain runs the tests under testrun's supervisor: they start redis-
// server and PostgreSQL, which must not outlive the test binary, even when
// it is killed. Most of them wait on their own stub, store and proxy (slow
// clients, delayed upstreams, timeouts), so up to 4 run at once unless
// -parallel was given.
func TestMain(m *testing.M) { testrun.MainParallel(m, 4) }
