package postgres_test

import (
	"flag"
	"os"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
)

// TestMain raises -test.parallel to 4 unless it was given: each test starts
// its own PostgreSQL cluster and then mostly waits (for the server to start,
// for outages, timeouts and standbys), so running more of them at once
// shortens the package's wall time even on 2 cores. A -parallel given on the
// command line wins.
//
// The tests run under testrun's supervisor, so that no PostgreSQL server
// outlives the test binary, even when it is killed.
func TestMain(m *testing.M) {
	testrun.Isolate()
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "test.parallel" {
			given = true
		}
	})
	if !given {
		if err := flag.Set("test.parallel", "4"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
