//go:build !linux

// Command chaos is the chaos run (docs/chaos.md). It runs on Linux only:
// it pauses and kills the processes it starts with signals and waits for
// them through /proc, fills Badger's disk on a tmpfs it mounts, and cuts
// power on a FUSE mount (internal/testenv/powerloss). Elsewhere it says so and
// exits with status 2.
package main

import (
	"fmt"
	"os"
	"runtime"
)

func main() {
	fmt.Fprintf(os.Stderr, "chaos: runs on Linux only (it needs /proc, tmpfs and FUSE mounts), not on %s; run it in a Linux container or VM\n", runtime.GOOS)
	os.Exit(2)
}
