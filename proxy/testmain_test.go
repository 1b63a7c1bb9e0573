package proxy_test

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain runs the tests under testrun's supervisor: they start redis-
// server and PostgreSQL, which must not outlive the test binary, even when
// it is killed.
func TestMain(m *testing.M) { testrun.Main(m) }
