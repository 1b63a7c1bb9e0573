package canary

import "time"

// StepWall moves c's wall clock by d from now on, as a suspended host
// finds it on waking (its monotonic clock stopped meanwhile).
func StepWall(c *Canaries, d time.Duration) {
	c.wall = func() int64 { return time.Now().Add(d).UnixNano() }
}
