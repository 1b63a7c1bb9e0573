//go:build long

package e2e

// long is true in a run built with -tags long (as .ci/run runs it): the
// soaks run, and the tests that repeat a race for the variety of its
// timings run their full count. A plain go test runs each of those
// enough times to catch a regression and leaves the soaks out.
const long = true
