package main

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain runs the tests under testrun's supervisor: they run scripts
// against the stub, which must not outlive the test binary, even when it is
// killed.
func TestMain(m *testing.M) { testrun.Main(m) }
