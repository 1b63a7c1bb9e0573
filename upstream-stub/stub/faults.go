package stub

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The fault names.
const (
	// faultFailBeforeCharge answers 500 and records nothing.
	faultFailBeforeCharge = "fail-before-charge"
	// faultFailAfterCharge records the charge, then answers 500.
	faultFailAfterCharge = "fail-after-charge"
	// faultDelay records the charge, then waits before answering 201.
	faultDelay = "delay"
	// faultDropAfterCharge records the charge, then closes the connection
	// without an answer.
	faultDropAfterCharge = "drop-after-charge"
	// faultReject429 answers 429 with Retry-After: 1 and records nothing.
	faultReject429 = "reject-429"
)

// knownFaults maps each fault name to whether the fault records the charge.
var knownFaults = map[string]bool{
	faultFailBeforeCharge: false,
	faultFailAfterCharge:  true,
	faultDelay:            true,
	faultDropAfterCharge:  true,
	faultReject429:        false,
}

// The fault headers of a charge request.
const (
	headerFault = "X-Stub-Fault"
	headerDelay = "X-Stub-Delay"
)

// maxFaultCount is the largest count one POST /faults accepts.
const maxFaultCount = 1_000_000

// fault is a fault to apply to one charge request. The zero fault is no fault.
type fault struct {
	name  string        // One of the fault constants, or empty for none.
	delay time.Duration // The wait of faultDelay; zero for the others.
}

// recordsCharge reports whether the charge is recorded under f.
func (f fault) recordsCharge() bool {
	return f.name == "" || knownFaults[f.name]
}

// queuedFault is an entry of the fault queue: a fault for the next remaining
// charge requests.
type queuedFault struct {
	fault
	remaining int
}

// faultView is a queue entry as GET /faults shows it.
type faultView struct {
	Fault string `json:"fault"`
	Count int    `json:"count"`
	Delay string `json:"delay,omitempty"`
}

// faultList is the answer of GET /faults and POST /faults.
type faultList struct {
	Faults int         `json:"faults"` // Charge requests the queue still affects.
	Items  []faultView `json:"items"`
}

// faultBody is the body of POST /faults.
type faultBody struct {
	Fault any `json:"fault"`
	Count any `json:"count"`
	Delay any `json:"delay"`
}

// queueFault handles POST /faults: it appends a fault for the next count
// charge requests to the queue and answers the queue.
func (s *server) queueFault(w http.ResponseWriter, r *http.Request) {
	var body faultBody
	if err := decodeBody(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	q, err := parseFaultBody(body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.mu.Lock()
	s.faults = append(s.faults, q)
	list := s.faultListLocked()
	s.mu.Unlock()
	log := s.logger.With("fault", q.name, "count", q.remaining)
	if q.name == faultDelay {
		log = log.With("delay", q.delay)
	}
	log.InfoContext(r.Context(), "fault queued")
	s.writeJSON(w, http.StatusCreated, list)
}

// listFaults handles GET /faults: the queue, next first.
func (s *server) listFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	list := s.faultListLocked()
	s.mu.Unlock()
	s.writeJSON(w, http.StatusOK, list)
}

// clearFaults handles DELETE /faults: it empties the queue.
func (s *server) clearFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
	s.logger.InfoContext(r.Context(), "faults cleared")
	w.WriteHeader(http.StatusNoContent)
}

// faultListLocked returns the queue as GET /faults shows it. s.mu must be
// held.
func (s *server) faultListLocked() faultList {
	list := faultList{Items: make([]faultView, 0, len(s.faults))}
	for _, q := range s.faults {
		v := faultView{Fault: q.name, Count: q.remaining}
		if q.name == faultDelay {
			v.Delay = q.delay.String()
		}
		list.Items = append(list.Items, v)
		list.Faults += q.remaining
	}
	return list
}

// nextFaultLocked takes the next fault off the queue, or returns the zero
// fault if the queue is empty. s.mu must be held.
func (s *server) nextFaultLocked() fault {
	if len(s.faults) == 0 {
		return fault{}
	}
	f := s.faults[0].fault
	s.faults[0].remaining--
	if s.faults[0].remaining == 0 {
		s.faults = slices.Delete(s.faults, 0, 1)
	}
	return f
}

// parseFaultBody validates the body of POST /faults. The count defaults to 1;
// the delay is required for the delay fault and ignored by the others.
func parseFaultBody(b faultBody) (queuedFault, error) {
	name, ok := b.Fault.(string)
	if !ok {
		return queuedFault{}, badRequest("fault is required, a JSON string: one of %s", strings.Join(sortedFaultNames(), ", "))
	}
	if err := checkFaultName(name); err != nil {
		return queuedFault{}, err
	}
	q := queuedFault{fault: fault{name: name}, remaining: 1}
	if b.Count != nil {
		n, ok := b.Count.(json.Number)
		if !ok {
			return queuedFault{}, badRequest("count must be a JSON integer")
		}
		count, err := strconv.Atoi(n.String())
		if err != nil {
			return queuedFault{}, badRequest("count must be an integer, got %s", n)
		}
		if count < 1 || count > maxFaultCount {
			return queuedFault{}, badRequest("count must be between 1 and %d, got %d", maxFaultCount, count)
		}
		q.remaining = count
	}
	if name == faultDelay {
		if b.Delay == nil {
			return queuedFault{}, badRequest(`delay is required for the delay fault, a duration such as "3s"`)
		}
		raw, ok := b.Delay.(string)
		if !ok {
			return queuedFault{}, badRequest(`delay must be a duration string such as "3s"`)
		}
		d, err := parseDelay(raw)
		if err != nil {
			return queuedFault{}, err
		}
		q.delay = d
	}
	return q, nil
}

// faultFromHeader returns the fault that X-Stub-Fault (and X-Stub-Delay for
// the delay fault) sets on one request, or the zero fault if the header is
// absent.
func faultFromHeader(h http.Header) (fault, error) {
	name := strings.TrimSpace(h.Get(headerFault))
	if name == "" {
		return fault{}, nil
	}
	if err := checkFaultName(name); err != nil {
		return fault{}, badRequest("%s: %v", headerFault, err)
	}
	f := fault{name: name}
	if name == faultDelay {
		raw := strings.TrimSpace(h.Get(headerDelay))
		if raw == "" {
			return fault{}, badRequest(`%s is required with %s: delay, a duration such as "3s"`, headerDelay, headerFault)
		}
		d, err := parseDelay(raw)
		if err != nil {
			return fault{}, badRequest("%s: %v", headerDelay, err)
		}
		f.delay = d
	}
	return f, nil
}

// checkFaultName reports an error if name is not a known fault.
func checkFaultName(name string) error {
	if _, ok := knownFaults[name]; !ok {
		return badRequest("unknown fault %q, want one of %s", name, strings.Join(sortedFaultNames(), ", "))
	}
	return nil
}

// parseDelay parses a delay: a Go duration, zero or more.
func parseDelay(raw string) (time.Duration, error) {
	d, err := time.ParseDuration(raw)
	if err != nil {
		return 0, badRequest(`delay %q is not a duration such as "3s"`, raw)
	}
	if d < 0 {
		return 0, badRequest("delay must not be negative, got %s", raw)
	}
	return d, nil
}

// sortedFaultNames returns the known fault names, sorted, for messages.
func sortedFaultNames() []string {
	names := make([]string, 0, len(knownFaults))
	for name := range knownFaults {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
