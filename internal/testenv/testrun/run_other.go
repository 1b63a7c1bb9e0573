//go:build !linux

package testrun

// isolate lets the tests run directly: the namespaces and the supervisor
// need Linux, where the tests run (CONTRIBUTING.md#platforms).
func isolate() {}
