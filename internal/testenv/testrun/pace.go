package testrun

import "time"

// Pace returns the slowest of three runs of step: how long the step takes
// on this machine now. A test whose setting or bound depends on the
// machine's speed (a timeout that a step must fit) derives it from Pace of
// that step, so that it holds on a busy machine as on an idle one, instead
// of a constant tuned on an idle one.
func Pace(step func()) time.Duration {
	var slowest time.Duration
	for range 3 {
		start := time.Now()
		step()
		slowest = max(slowest, time.Since(start))
	}
	return slowest
}
