// Package stub is the upstream stub's charge service: a deliberately
// non-idempotent HTTP handler that records a new charge on every call and
// can fail on demand in each of the ways idemproxy must survive. The
// upstream-stub command serves it; idemproxy's tests serve it in-process.
package stub

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxBodyBytes is the largest request body the stub reads; beyond it the
// answer is 413.
const maxBodyBytes = 1 << 20

// charge is one recorded charge, as it appears in every answer.
type charge struct {
	ChargeID  string      `json:"chargeId"`
	OrderID   string      `json:"orderId"`
	Amount    json.Number `json:"amount"`
	CreatedAt time.Time   `json:"createdAt"`
}

// chargeList is the answer of GET /charges.
type chargeList struct {
	Charges int      `json:"charges"`
	Items   []charge `json:"items"`
}

// statement is the answer of GET /orders/{orderId}/charges.
type statement struct {
	OrderID string   `json:"orderId"`
	Charges int      `json:"charges"`
	Items   []charge `json:"items"`
}

// server holds the stub's state: the charges and the fault queue. It is safe
// for concurrent use.
type server struct {
	logger *slog.Logger

	mu      sync.Mutex
	charges []charge         // Every charge, oldest first.
	byOrder map[string][]int // Indexes into charges, per orderId.
	faults  []queuedFault    // Pending faults, next first.
}

// New returns the stub's HTTP handler, with empty state, logging to
// logger.
func New(logger *slog.Logger) http.Handler {
	s := &server{logger: logger, byOrder: make(map[string][]int)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", s.createCharge)
	mux.HandleFunc("POST /orders/{orderId}/charges", s.createCharge)
	mux.HandleFunc("GET /charges", s.listCharges)
	mux.HandleFunc("DELETE /charges", s.deleteCharges)
	mux.HandleFunc("GET /orders/{orderId}/charges", s.orderStatement)
	mux.HandleFunc("GET /orders/{orderId}/charge", s.latestCharge)
	mux.HandleFunc("POST /faults", s.queueFault)
	mux.HandleFunc("GET /faults", s.listFaults)
	mux.HandleFunc("DELETE /faults", s.clearFaults)
	mux.HandleFunc("POST /reset", s.reset)
	mux.HandleFunc("GET /healthz", s.healthz)
	return mux
}

// chargeBody is the body of POST /charges. The fields are decoded as any, with
// numbers as json.Number, and validated by parseOrderID and parseAmount.
type chargeBody struct {
	OrderID any `json:"orderId"`
	Amount  any `json:"amount"`
}

// createCharge handles POST /charges and POST /orders/{orderId}/charges (the
// order in the path; an orderId in the body, if any, must match): it records a new charge, unless a fault
// says otherwise. A request rejected with 400 or 413 records nothing and does
// not consume the fault queue.
func (s *server) createCharge(w http.ResponseWriter, r *http.Request) {
	hf, err := faultFromHeader(r.Header)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var body chargeBody
	if err := decodeBody(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	orderID := r.PathValue("orderId")
	if orderID == "" || body.OrderID != nil {
		id, err := parseOrderID(body.OrderID)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if orderID != "" && id != orderID {
			s.fail(w, r, badRequest("orderId %q in the body differs from %q in the path", id, orderID))
			return
		}
		orderID = id
	}
	amount, err := parseAmount(body.Amount)
	if err != nil {
		s.fail(w, r, err)
		return
	}

	s.mu.Lock()
	f := hf
	if f.name == "" {
		f = s.nextFaultLocked()
	}
	var c charge
	if f.recordsCharge() {
		c = s.recordLocked(orderID, amount)
	}
	s.mu.Unlock()

	log := s.logger.With("orderId", orderID, "amount", amount.String())
	if f.name != "" {
		log = log.With("fault", f.name)
	}
	if c.ChargeID != "" {
		log.InfoContext(r.Context(), "charge recorded", "chargeId", c.ChargeID)
	}

	switch f.name {
	case "":
		s.writeJSON(w, http.StatusCreated, c)
	case faultFailBeforeCharge:
		log.InfoContext(r.Context(), "fault injected, nothing recorded")
		s.writeProblem(w, problem{
			Status: http.StatusInternalServerError,
			Detail: "injected fault fail-before-charge: the charge was not recorded",
			Fault:  f.name,
		})
	case faultReject429:
		log.InfoContext(r.Context(), "fault injected, nothing recorded")
		w.Header().Set("Retry-After", "1")
		s.writeProblem(w, problem{
			Status: http.StatusTooManyRequests,
			Detail: "injected fault reject-429: the charge was not recorded, retry after 1 second",
			Fault:  f.name,
		})
	case faultFailAfterCharge:
		log.InfoContext(r.Context(), "fault injected after the charge")
		s.writeProblem(w, problem{
			Status: http.StatusInternalServerError,
			Detail: "injected fault fail-after-charge: the charge was recorded, but the answer is an error",
			Fault:  f.name,
		})
	case faultDelay:
		log.InfoContext(r.Context(), "fault injected, delaying the answer", "delay", f.delay)
		if !s.wait(w, r, f.delay) {
			log.InfoContext(r.Context(), "client gave up during the delay; the charge stays recorded", "err", context.Cause(r.Context()))
			return
		}
		s.writeJSON(w, http.StatusCreated, c)
	case faultDropAfterCharge:
		log.InfoContext(r.Context(), "fault injected, dropping the connection")
		s.drop(w, r)
	}
}

// answerMargin is the time left to write the answer after a delay.
const answerMargin = 30 * time.Second

// wait waits for d before the answer, after extending the connection's
// deadlines so the server timeouts do not cut the delay short. It reports
// false if the request's context ended first.
func (s *server) wait(w http.ResponseWriter, r *http.Request, d time.Duration) bool {
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(d + answerMargin)
	if err := rc.SetReadDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.logger.WarnContext(r.Context(), "extend read deadline", "err", err)
	}
	if err := rc.SetWriteDeadline(deadline); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.logger.WarnContext(r.Context(), "extend write deadline", "err", err)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// drop closes the client's connection without an answer. If the connection
// cannot be hijacked (HTTP/2), it aborts the handler instead, which resets
// the stream.
func (s *server) drop(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if err := conn.Close(); err != nil {
		s.logger.DebugContext(r.Context(), "close hijacked connection", "err", err)
	}
}

// recordLocked records a new charge and returns it. s.mu must be held.
func (s *server) recordLocked(orderID string, amount json.Number) charge {
	c := charge{
		ChargeID:  newChargeID(),
		OrderID:   orderID,
		Amount:    amount,
		CreatedAt: time.Now().UTC(),
	}
	s.charges = append(s.charges, c)
	s.byOrder[orderID] = append(s.byOrder[orderID], len(s.charges)-1)
	return c
}

// newChargeID returns a new random charge ID, "ch_" and 26 base32 characters.
func newChargeID() string {
	return "ch_" + strings.ToLower(rand.Text())
}

// listCharges handles GET /charges: every charge, oldest first.
func (s *server) listCharges(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	items := append(make([]charge, 0, len(s.charges)), s.charges...)
	s.mu.Unlock()
	s.writeJSON(w, http.StatusOK, chargeList{Charges: len(items), Items: items})
}

// deleteCharges handles DELETE /charges: it empties the statement.
func (s *server) deleteCharges(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n := len(s.charges)
	s.charges = nil
	s.byOrder = make(map[string][]int)
	s.mu.Unlock()
	s.logger.InfoContext(r.Context(), "charges deleted", "count", n)
	w.WriteHeader(http.StatusNoContent)
}

// reset handles POST /reset: it empties the statement and the fault queue
// at once, so that a walk-through can start again from a clean stub.
func (s *server) reset(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	n, f := len(s.charges), len(s.faults)
	s.charges = nil
	s.byOrder = make(map[string][]int)
	s.faults = nil
	s.mu.Unlock()
	s.logger.InfoContext(r.Context(), "stub reset", "charges", n, "faults", f)
	w.WriteHeader(http.StatusNoContent)
}

// orderStatement handles GET /orders/{orderId}/charges: the charges of one
// order, oldest first; none for an unknown order.
func (s *server) orderStatement(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("orderId")
	s.mu.Lock()
	idx := s.byOrder[orderID]
	items := make([]charge, 0, len(idx))
	for _, i := range idx {
		items = append(items, s.charges[i])
	}
	s.mu.Unlock()
	s.writeJSON(w, http.StatusOK, statement{OrderID: orderID, Charges: len(items), Items: items})
}

// latestCharge handles GET /orders/{orderId}/charge, the question an
// idempotency proxy asks about a request whose answer it lost ("was this
// order charged?"): 200 with the order's latest charge, or 404 when the
// order has none.
func (s *server) latestCharge(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("orderId")
	s.mu.Lock()
	idx := s.byOrder[orderID]
	var c charge
	if len(idx) > 0 {
		c = s.charges[idx[len(idx)-1]]
	}
	s.mu.Unlock()
	if len(idx) == 0 {
		s.writeProblem(w, problem{Status: http.StatusNotFound, Detail: fmt.Sprintf("order %q has no charge", orderID)})
		return
	}
	s.writeJSON(w, http.StatusOK, c)
}

// healthz handles GET /healthz.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// requestError is a client error, answered with its status and message.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

// badRequest returns a 400 requestError.
func badRequest(format string, args ...any) error {
	return &requestError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// decodeBody decodes the request body, at most maxBodyBytes of it, as a
// single JSON object into dst, with numbers as json.Number.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.UseNumber()
	if err := dec.Decode(dst); err != nil {
		return bodyError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return bodyError(err)
		}
		return badRequest("request body must hold a single JSON object, found more after it")
	}
	return nil
}

// bodyError turns an error from decoding the request body into a
// requestError.
func bodyError(err error) error {
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		return &requestError{
			status: http.StatusRequestEntityTooLarge,
			msg:    fmt.Sprintf("request body is larger than %d bytes", tooBig.Limit),
		}
	case errors.Is(err, io.EOF):
		return badRequest("request body is empty, want a JSON object")
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return badRequest("request body must be a JSON object, got a JSON %s", typeErr.Value)
	default:
		return badRequest("request body is not valid JSON: %v", err)
	}
}

// parseOrderID validates an orderId: a non-empty JSON string, or a JSON
// number, recorded with its literal digits.
func parseOrderID(v any) (string, error) {
	switch v := v.(type) {
	case nil:
		return "", badRequest("orderId is required")
	case string:
		if strings.TrimSpace(v) == "" {
			return "", badRequest("orderId must not be empty")
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	default:
		return "", badRequest("orderId must be a JSON string or number")
	}
}

// parseAmount validates an amount: a JSON number greater than zero, kept as
// written.
func parseAmount(v any) (json.Number, error) {
	switch v := v.(type) {
	case nil:
		return "", badRequest("amount is required")
	case json.Number:
		if !positive(v) {
			return "", badRequest("amount must be greater than zero, got %s", v)
		}
		return v, nil
	default:
		return "", badRequest("amount must be a JSON number")
	}
}

// positive reports whether n, a valid JSON number, is greater than zero. It
// works on the text, so it is exact for any precision and exponent.
func positive(n json.Number) bool {
	s := n.String()
	if strings.HasPrefix(s, "-") {
		return false
	}
	mantissa, _, _ := strings.Cut(strings.ToLower(s), "e")
	return strings.ContainsAny(mantissa, "123456789")
}

// problem is an RFC 9457 problem details body. Fault is an extension member
// naming the injected fault, if any.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Fault  string `json:"fault,omitempty"`
}

// fail answers err as a problem: its status for a requestError, 500 for any
// other error.
func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var re *requestError
	if !errors.As(err, &re) {
		s.logger.ErrorContext(r.Context(), "request failed", "err", err)
		s.writeProblem(w, problem{Status: http.StatusInternalServerError, Detail: "internal error"})
		return
	}
	s.logger.InfoContext(r.Context(), "request rejected", "method", r.Method, "path", r.URL.Path, "status", re.status, "err", re.msg)
	s.writeProblem(w, problem{Status: re.status, Detail: re.msg})
}

// writeProblem writes p as application/problem+json. The type defaults to
// about:blank and the title to the status text.
func (s *server) writeProblem(w http.ResponseWriter, p problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	s.write(w, p.Status, "application/problem+json", p)
}

// writeJSON writes v as application/json with status.
func (s *server) writeJSON(w http.ResponseWriter, status int, v any) {
	s.write(w, status, "application/json", v)
}

func (s *server) write(w http.ResponseWriter, status int, contentType string, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		s.logger.Error("encode answer", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	if _, err := w.Write(append(body, '\n')); err != nil {
		s.logger.Debug("write answer", "err", err)
	}
}
