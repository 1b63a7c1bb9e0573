//go:build !unix

// Command bench is the benchmark (see main.go). It runs on Unix only: it
// runs PostgreSQL as the postgres user, syncs the disk and reads /proc.
// Elsewhere it says so and exits with status 2.
package main

import (
	"fmt"
	"os"
	"runtime"
)

func main() {
	fmt.Fprintf(os.Stderr, "bench: runs on Linux (and other Unix systems), not on %s\n", runtime.GOOS)
	os.Exit(2)
}
