// Package check is the chaos run's checker. It reads only two things: the
// history the run recorded (every request a client sent, with its key, its
// start and end and the answer it got) and the upstream stub's statement (the
// charges the stub recorded). It never asks the proxy anything, so a bug in
// the proxy cannot hide itself from it.
package check

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Policies of a route, as in the proxy's configuration.
const (
	ReserveThenCommit = "reserve-then-commit"
	ReleaseOn5xx      = "release-on-5xx"
)

// Route describes one protected route of the run: what the checker must know
// to read its answers.
type Route struct {
	Policy    string `json:"policy"`
	Reconcile bool   `json:"reconcile"`
}

// Op is one HTTP attempt a client made: one request on the wire, with its
// answer or its error. Times are nanoseconds since the start of the run.
type Op struct {
	ID      int    `json:"id"`
	Client  int    `json:"client"`
	Kind    string `json:"kind"`  // retry, duplicate, storm, probe
	Proxy   string `json:"proxy"` // the proxy process that was asked
	Route   string `json:"route"`
	Order   string `json:"order"` // the order ID, unique per key over the run
	Start   int64  `json:"start"`
	End     int64  `json:"end"`
	Status  int    `json:"status,omitempty"`
	Body    string `json:"body,omitempty"`
	Ctype   string `json:"contentType,omitempty"`
	Replay  bool   `json:"replayed,omitempty"`
	Recon   bool   `json:"reconciled,omitempty"`
	Err     string `json:"err,omitempty"`
	NotSent bool   `json:"notSent,omitempty"` // the error came before any byte was written (dial failed)
}

// Sample is a reading of one proxy's health at the baseline (before the load)
// or at the end (after the faults stopped and keys settled).
type Sample struct {
	Proxy      string  `json:"proxy"`
	Ready      bool    `json:"ready"`
	Goroutines float64 `json:"goroutines"`
	HeapBytes  float64 `json:"heapBytes"`
}

// Loss is a fault that made a shared store forget every key it held (the
// server restarted empty, or its table was emptied), or some of them (a
// partial loss: keys evicted, a lagging replica promoted, an older dump
// restored), and, later, an operator's acceptance of the loss (idemproxy
// store accept-loss). Times are nanoseconds since the start of the run.
type Loss struct {
	// Store names the store server (redis, postgres).
	Store string `json:"store"`
	// Kind is the fault kind that caused it.
	Kind string `json:"kind,omitempty"`
	// Proxies are the proxies that share the store.
	Proxies []string `json:"proxies"`
	// At is when the store had forgotten its keys and served again.
	At int64 `json:"at"`
	// Partial says the store forgot some keys, not its epoch marker: the
	// proxies find out by other means (canaries, the witness of recent
	// answers, the setting checks), within the detection window.
	Partial bool `json:"partial,omitempty"`
	// Detect is the end of the detection window of a partial loss: the
	// promised bound by which every proxy of the store refuses. A key
	// retried in [At, Detect) on a replica that cannot know it (not the
	// one that answered it, or one that restarted since) may be charged
	// again: counted, not a violation. 0: At (the marker catches a loss
	// of every key at once).
	Detect int64 `json:"detect,omitempty"`
	// Accepted is when the operator's acceptance returned; 0: never
	// accepted during the run (for a partial loss: no proxy marked the
	// store lost).
	Accepted int64 `json:"accepted"`
}

// detected is when the proxies of the store must refuse from.
func (l Loss) detected() int64 { return max(l.At, l.Detect) }

// Start is a proxy process started (at the run's start, or again after a
// fault): its memory of the keys it answered is empty.
type Start struct {
	Proxy string `json:"proxy"`
	At    int64  `json:"at"`
}

// History is everything the run recorded.
type History struct {
	Seed     int64            `json:"seed"`
	Routes   map[string]Route `json:"routes"`
	Ops      []Op             `json:"ops"`
	Baseline []Sample         `json:"baseline"`
	Final    []Sample         `json:"final"`
	Losses   []Loss           `json:"losses,omitempty"`
	Cuts     []Cut            `json:"cuts,omitempty"`
	// Starts are the proxies' process starts.
	Starts []Start `json:"starts,omitempty"`
	// Failovers are the shared stores' failovers.
	Failovers []Failover `json:"failovers,omitempty"`
	// Outages are the windows in which a shared store took no writes for
	// about a lease or longer.
	Outages []Outage `json:"outages,omitempty"`
	// StartUnixNano is the wall-clock time of the run's start (the zero of
	// the times above), to place the statement's createdAt among them; 0:
	// unknown.
	StartUnixNano int64 `json:"startUnixNano,omitempty"`
}

// Charge is one charge of the stub's statement, with its JSON as the stub
// serialises it.
type Charge struct {
	ChargeID string
	OrderID  string
	Raw      json.RawMessage
}

// Statement is the stub's record of charges (GET /charges).
type Statement []Charge

// ParseStatement reads the body of the stub's GET /charges.
func ParseStatement(b []byte) (Statement, error) {
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("parse statement: %w", err)
	}
	st := make(Statement, 0, len(list.Items))
	for _, raw := range list.Items {
		var c struct {
			ChargeID string `json:"chargeId"`
			OrderID  string `json:"orderId"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("parse statement item %s: %w", raw, err)
		}
		st = append(st, Charge{ChargeID: c.ChargeID, OrderID: c.OrderID, Raw: raw})
	}
	return st, nil
}

// WriteJSON writes v to path as indented JSON.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// problemType returns the short name of an idemproxy problem answer
// ("request-in-flight"), or "" for any other answer (the upstream's).
func problemType(o Op) string {
	if !strings.HasPrefix(o.Ctype, "application/problem+json") {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal([]byte(o.Body), &p) != nil {
		return ""
	}
	name, ok := strings.CutPrefix(p.Type, "urn:idemproxy:problem:")
	if !ok {
		return ""
	}
	return name
}

// Failover is a shared store's primary replaced by its replica or standby
// (killed, paused, or failed over on purpose). Times are nanoseconds since
// the start of the run.
type Failover struct {
	// Store names the store server (redis, postgres).
	Store string `json:"store"`
	// Proxies are the proxies that share the store.
	Proxies []string `json:"proxies"`
	// At is when the writes the old primary acknowledged may start to be
	// lost: shortly before the fault that caused the failover.
	At int64 `json:"at"`
	// End is when the old primary no longer takes writes (a replica of
	// the new one, or down), plus a margin.
	End int64 `json:"end"`
	// Lossy says that a write acknowledged by the old primary alone may
	// be lost (Redis without wait_replicas: replication is asynchronous).
	// A key written in [At, End] may then be charged again by an attempt
	// that starts after At; the checker counts such keys, and leaves
	// properties 2 to 5 out for the keys written in the window. A
	// failover that is not lossy (PostgreSQL with a synchronous standby,
	// Redis with wait_replicas) is held to every property.
	Lossy bool `json:"lossy,omitempty"`
}

// Outage is a window in which a shared store took no writes for about a
// lease or longer (paused past the lease, or a failover as long). A
// reservation the store applied but whose reply was lost (answered 503
// store-unavailable) is released in the background only while its lease
// holds: through such an outage it runs out, and the key is in doubt
// although no attempt was forwarded. Times are nanoseconds since the start
// of the run.
type Outage struct {
	Store   string   `json:"store"`
	Proxies []string `json:"proxies"`
	At      int64    `json:"at"`
	End     int64    `json:"end"`
}
