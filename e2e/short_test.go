//go:build !long

package e2e

// long is false without -tags long: see long_test.go.
const long = false
