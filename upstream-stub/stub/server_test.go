package stub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// newTestServer starts the stub's handler on an httptest server that logs to
// the test output.
func newTestServer(t *testing.T) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(New(testLogger(t)))
	t.Cleanup(ts.Close)
	return ts
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// response is an answer read in full.
type response struct {
	status int
	header http.Header
	body   []byte
}

// send sends a request and reads the answer; it fails the test on a transport
// error.
func send(t *testing.T, client *http.Client, method, url, body string, header map[string]string) response {
	t.Helper()
	resp, err := trySend(client, method, url, body, header)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp
}

// trySend sends a request and reads the answer.
func trySend(client *http.Client, method, url, body string, header map[string]string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return response{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// freshClient returns a client that opens a new connection for every
// request, so a dropped connection is never retried.
func freshClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	return v
}

// wantJSON checks the status and content type of a JSON answer.
func wantJSON(t *testing.T, r response, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", got)
	}
}

// wantProblem checks that r is an RFC 9457 problem with status and returns
// it.
func wantProblem(t *testing.T, r response, status int) problem {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	if got := r.header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", got)
	}
	var p problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decode problem %s: %v", r.body, err)
	}
	want := problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: p.Detail, Fault: p.Fault}
	if p != want {
		t.Errorf("problem = %+v, want %+v", p, want)
	}
	if p.Detail == "" {
		t.Errorf("problem detail is empty: %s", r.body)
	}
	return p
}

func listCharges(t *testing.T, ts *httptest.Server) chargeList {
	t.Helper()
	r := send(t, ts.Client(), "GET", ts.URL+"/charges", "", nil)
	wantJSON(t, r, http.StatusOK)
	return decode[chargeList](t, r)
}

func orderCharges(t *testing.T, ts *httptest.Server, orderID string) statement {
	t.Helper()
	r := send(t, ts.Client(), "GET", ts.URL+"/orders/"+orderID+"/charges", "", nil)
	wantJSON(t, r, http.StatusOK)
	return decode[statement](t, r)
}

func listFaults(t *testing.T, ts *httptest.Server) faultList {
	t.Helper()
	r := send(t, ts.Client(), "GET", ts.URL+"/faults", "", nil)
	wantJSON(t, r, http.StatusOK)
	return decode[faultList](t, r)
}

func queue(t *testing.T, ts *httptest.Server, body string) {
	t.Helper()
	r := send(t, ts.Client(), "POST", ts.URL+"/faults", body, nil)
	wantJSON(t, r, http.StatusCreated)
}

func postCharge(t *testing.T, ts *httptest.Server, body string, header map[string]string) response {
	t.Helper()
	return send(t, ts.Client(), "POST", ts.URL+"/charges", body, header)
}

// wantCharge checks that r is a 201 with a new charge and returns it.
func wantCharge(t *testing.T, r response, orderID, amount string) charge {
	t.Helper()
	wantJSON(t, r, http.StatusCreated)
	c := decode[charge](t, r)
	if !strings.HasPrefix(c.ChargeID, "ch_") || len(c.ChargeID) <= len("ch_") {
		t.Errorf("chargeId = %q, want ch_<id>", c.ChargeID)
	}
	if c.OrderID != orderID {
		t.Errorf("orderId = %q, want %q", c.OrderID, orderID)
	}
	if c.Amount.String() != amount {
		t.Errorf("amount = %s, want %s", c.Amount, amount)
	}
	if !bytes.Contains(r.body, []byte(`"amount":`+amount+`,`)) {
		t.Errorf("body %s does not carry the amount %s as written", r.body, amount)
	}
	var raw struct {
		CreatedAt string `json:"createdAt"`
	}
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
	if _, err := time.Parse(time.RFC3339, raw.CreatedAt); err != nil {
		t.Errorf("createdAt %q is not RFC 3339: %v", raw.CreatedAt, err)
	}
	return c
}

func TestCreateCharge(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		wantOrder  string
		wantAmount string
	}{
		{"string orderId", `{"orderId": "ORD-1", "amount": 100}`, "ORD-1", "100"},
		{"numeric orderId keeps its digits", `{"orderId": 1001, "amount": 100}`, "1001", "100"},
		{"numeric orderId with exponent", `{"orderId": 1.5e3, "amount": 1}`, "1.5e3", "1"},
		{"decimal amount stays as written", `{"orderId": "ORD-2", "amount": 10.50}`, "ORD-2", "10.50"},
		{"tiny amount", `{"orderId": "ORD-3", "amount": 1e-400}`, "ORD-3", "1e-400"},
		{"unknown fields ignored", `{"orderId": "ORD-4", "amount": 5, "currency": "EUR"}`, "ORD-4", "5"},
		{"orderId with a slash and a space", `{"orderId": "A/B 1", "amount": 7}`, "A/B 1", "7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t)
			c := wantCharge(t, postCharge(t, ts, tt.body, nil), tt.wantOrder, tt.wantAmount)

			all := listCharges(t, ts)
			if all.Charges != 1 || len(all.Items) != 1 || all.Items[0] != c {
				t.Errorf("GET /charges = %+v, want the one charge %+v", all, c)
			}
			st := orderCharges(t, ts, urlPathEscape(tt.wantOrder))
			if st.OrderID != tt.wantOrder || st.Charges != 1 || len(st.Items) != 1 || st.Items[0] != c {
				t.Errorf("statement = %+v, want order %q with the one charge %+v", st, tt.wantOrder, c)
			}
		})
	}
}

// urlPathEscape escapes an orderId for a path segment.
func urlPathEscape(s string) string {
	return strings.NewReplacer("/", "%2F", " ", "%20").Replace(s)
}

func TestRepeatedOrderIsChargedAgain(t *testing.T) {
	ts := newTestServer(t)
	body := `{"orderId": "ORD-9", "amount": 100}`
	first := wantCharge(t, postCharge(t, ts, body, nil), "ORD-9", "100")
	second := wantCharge(t, postCharge(t, ts, body, nil), "ORD-9", "100")
	if first.ChargeID == second.ChargeID {
		t.Errorf("both calls answered chargeId %q, want a new one each time", first.ChargeID)
	}
	st := orderCharges(t, ts, "ORD-9")
	if st.Charges != 2 || len(st.Items) != 2 {
		t.Fatalf("statement charges = %d (%d items), want 2", st.Charges, len(st.Items))
	}
	if st.Items[0] != first || st.Items[1] != second {
		t.Errorf("statement items = %+v, want [%+v %+v] in order", st.Items, first, second)
	}
}

func TestNumericOrderIDEqualsStringOrderID(t *testing.T) {
	ts := newTestServer(t)
	wantCharge(t, postCharge(t, ts, `{"orderId": 1001, "amount": 1}`, nil), "1001", "1")
	wantCharge(t, postCharge(t, ts, `{"orderId": "1001", "amount": 2}`, nil), "1001", "2")
	st := orderCharges(t, ts, "1001")
	if st.Charges != 2 {
		t.Fatalf("statement of 1001 has %d charges, want 2: %+v", st.Charges, st)
	}
	for _, c := range st.Items {
		if c.OrderID != "1001" {
			t.Errorf("item orderId = %q, want \"1001\"", c.OrderID)
		}
	}
}

func TestCreateChargeBadInput(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		header map[string]string
		status int
	}{
		{"not JSON", `orderId=1&amount=2`, nil, 400},
		{"empty body", ``, nil, 400},
		{"truncated JSON", `{"orderId": "A", "amount": 1`, nil, 400},
		{"JSON array", `[{"orderId": "A", "amount": 1}]`, nil, 400},
		{"JSON null", `null`, nil, 400},
		{"trailing data", `{"orderId": "A", "amount": 1} {}`, nil, 400},
		{"missing orderId", `{"amount": 1}`, nil, 400},
		{"empty orderId", `{"orderId": "", "amount": 1}`, nil, 400},
		{"blank orderId", `{"orderId": "  ", "amount": 1}`, nil, 400},
		{"null orderId", `{"orderId": null, "amount": 1}`, nil, 400},
		{"boolean orderId", `{"orderId": true, "amount": 1}`, nil, 400},
		{"object orderId", `{"orderId": {"id": 1}, "amount": 1}`, nil, 400},
		{"array orderId", `{"orderId": [1], "amount": 1}`, nil, 400},
		{"missing amount", `{"orderId": "A"}`, nil, 400},
		{"null amount", `{"orderId": "A", "amount": null}`, nil, 400},
		{"zero amount", `{"orderId": "A", "amount": 0}`, nil, 400},
		{"zero decimal amount", `{"orderId": "A", "amount": 0.00}`, nil, 400},
		{"zero exponent amount", `{"orderId": "A", "amount": 0e5}`, nil, 400},
		{"negative amount", `{"orderId": "A", "amount": -5}`, nil, 400},
		{"negative zero amount", `{"orderId": "A", "amount": -0}`, nil, 400},
		{"string amount", `{"orderId": "A", "amount": "10"}`, nil, 400},
		{"boolean amount", `{"orderId": "A", "amount": true}`, nil, 400},
		{"unknown fault header", `{"orderId": "A", "amount": 1}`, map[string]string{headerFault: "explode"}, 400},
		{"delay header without delay", `{"orderId": "A", "amount": 1}`, map[string]string{headerFault: "delay"}, 400},
		{"unparsable delay header", `{"orderId": "A", "amount": 1}`, map[string]string{headerFault: "delay", headerDelay: "soon"}, 400},
		{"negative delay header", `{"orderId": "A", "amount": 1}`, map[string]string{headerFault: "delay", headerDelay: "-1s"}, 400},
		{"body too large", `{"orderId": "A", "amount": 1, "pad": "` + strings.Repeat("x", maxBodyBytes) + `"}`, nil, 413},
		{"too large after the object", `{"orderId": "A", "amount": 1}` + strings.Repeat(" ", maxBodyBytes), nil, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t)
			wantProblem(t, postCharge(t, ts, tt.body, tt.header), tt.status)
			if got := listCharges(t, ts); got.Charges != 0 || len(got.Items) != 0 {
				t.Errorf("after a rejected request GET /charges = %+v, want no charges", got)
			}
		})
	}
}

func TestOrderStatement(t *testing.T) {
	ts := newTestServer(t)

	r := send(t, ts.Client(), "GET", ts.URL+"/orders/unknown/charges", "", nil)
	wantJSON(t, r, http.StatusOK)
	if got, want := strings.TrimSpace(string(r.body)), `{"orderId":"unknown","charges":0,"items":[]}`; got != want {
		t.Errorf("statement of an unknown order = %s, want %s", got, want)
	}

	a1 := wantCharge(t, postCharge(t, ts, `{"orderId": "A", "amount": 1}`, nil), "A", "1")
	b1 := wantCharge(t, postCharge(t, ts, `{"orderId": "B", "amount": 2}`, nil), "B", "2")
	a2 := wantCharge(t, postCharge(t, ts, `{"orderId": "A", "amount": 3}`, nil), "A", "3")

	tests := []struct {
		order string
		want  []charge
	}{
		{"A", []charge{a1, a2}},
		{"B", []charge{b1}},
		{"C", []charge{}},
	}
	for _, tt := range tests {
		st := orderCharges(t, ts, tt.order)
		if st.OrderID != tt.order || st.Charges != len(tt.want) || !slices.Equal(st.Items, tt.want) {
			t.Errorf("statement of %s = %+v, want %d charges %+v", tt.order, st, len(tt.want), tt.want)
		}
	}
}

func TestLatestCharge(t *testing.T) {
	ts := newTestServer(t)
	a1 := wantCharge(t, postCharge(t, ts, `{"orderId": "A", "amount": 1}`, nil), "A", "1")
	a2 := wantCharge(t, postCharge(t, ts, `{"orderId": "A", "amount": 3}`, nil), "A", "3")
	b1 := wantCharge(t, postCharge(t, ts, `{"orderId": "B/1", "amount": 2}`, nil), "B/1", "2")
	tests := []struct {
		path   string
		status int
		want   charge
	}{
		{"/orders/A/charge", http.StatusOK, a2},
		{"/orders/B%2F1/charge", http.StatusOK, b1},
		{"/orders/C/charge", http.StatusNotFound, charge{}},
	}
	for _, tt := range tests {
		r := send(t, ts.Client(), "GET", ts.URL+tt.path, "", nil)
		if r.status != tt.status {
			t.Fatalf("GET %s = %d %s, want %d", tt.path, r.status, r.body, tt.status)
		}
		if tt.status != http.StatusOK {
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("GET %s Content-Type = %q, want application/problem+json", tt.path, ct)
			}
			continue
		}
		var got charge
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatal(err)
		}
		if got != tt.want {
			t.Errorf("GET %s = %+v, want %+v (not the first, %+v)", tt.path, got, tt.want, a1)
		}
	}
}

func TestListAndDeleteCharges(t *testing.T) {
	ts := newTestServer(t)

	r := send(t, ts.Client(), "GET", ts.URL+"/charges", "", nil)
	wantJSON(t, r, http.StatusOK)
	if got, want := strings.TrimSpace(string(r.body)), `{"charges":0,"items":[]}`; got != want {
		t.Errorf("empty GET /charges = %s, want %s", got, want)
	}

	var want []charge
	for i, order := range []string{"A", "B", "A"} {
		want = append(want, wantCharge(t, postCharge(t, ts, fmt.Sprintf(`{"orderId": %q, "amount": %d}`, order, i+1), nil), order, fmt.Sprint(i+1)))
	}
	if got := listCharges(t, ts); got.Charges != 3 || !slices.Equal(got.Items, want) {
		t.Errorf("GET /charges = %+v, want 3 charges %+v", got, want)
	}

	r = send(t, ts.Client(), "DELETE", ts.URL+"/charges", "", nil)
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("DELETE /charges = %d %q, want 204 and no body", r.status, r.body)
	}
	if got := listCharges(t, ts); got.Charges != 0 || len(got.Items) != 0 {
		t.Errorf("GET /charges after DELETE = %+v, want none", got)
	}
	if got := orderCharges(t, ts, "A"); got.Charges != 0 || len(got.Items) != 0 {
		t.Errorf("statement of A after DELETE = %+v, want none", got)
	}
	wantCharge(t, postCharge(t, ts, `{"orderId": "A", "amount": 1}`, nil), "A", "1")
	if got := orderCharges(t, ts, "A"); got.Charges != 1 {
		t.Errorf("statement of A after DELETE and a new charge has %d charges, want 1", got.Charges)
	}
}

func TestHealthz(t *testing.T) {
	ts := newTestServer(t)
	r := send(t, ts.Client(), "GET", ts.URL+"/healthz", "", nil)
	wantJSON(t, r, http.StatusOK)
	if got := decode[map[string]string](t, r)["status"]; got != "ok" {
		t.Errorf("status = %q, want ok", got)
	}
}

func TestRouting(t *testing.T) {
	tests := []struct {
		method, path string
		status       int
		allow        string
	}{
		{"PUT", "/charges", http.StatusMethodNotAllowed, "DELETE, GET, HEAD, POST"},
		{"PATCH", "/faults", http.StatusMethodNotAllowed, "DELETE, GET, HEAD, POST"},
		{"PUT", "/orders/A/charges", http.StatusMethodNotAllowed, "GET, HEAD, POST"},
		{"GET", "/nope", http.StatusNotFound, ""},
		{"GET", "/orders/A", http.StatusNotFound, ""},
		{"GET", "/reset", http.StatusMethodNotAllowed, "POST"},
	}
	ts := newTestServer(t)
	for _, tt := range tests {
		r := send(t, ts.Client(), tt.method, ts.URL+tt.path, "", nil)
		if r.status != tt.status {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, r.status, tt.status)
		}
		if got := r.header.Get("Allow"); got != tt.allow {
			t.Errorf("%s %s Allow = %q, want %q", tt.method, tt.path, got, tt.allow)
		}
	}
}

func TestFaults(t *testing.T) {
	tests := []struct {
		fault, delay   string
		wantStatus     int // 0: the connection is dropped without an answer.
		wantRecorded   int
		wantRetryAfter string
		wantMinElapsed time.Duration
	}{
		{fault: faultFailBeforeCharge, wantStatus: 500, wantRecorded: 0},
		{fault: faultFailAfterCharge, wantStatus: 500, wantRecorded: 1},
		{fault: faultDelay, delay: "300ms", wantStatus: 201, wantRecorded: 1, wantMinElapsed: 300 * time.Millisecond},
		{fault: faultDelay, delay: "0s", wantStatus: 201, wantRecorded: 1},
		{fault: faultDropAfterCharge, wantStatus: 0, wantRecorded: 1},
		{fault: faultReject429, wantStatus: 429, wantRecorded: 0, wantRetryAfter: "1"},
	}
	for _, mode := range []string{"queued", "header"} {
		for _, tt := range tests {
			t.Run(mode+"/"+tt.fault+tt.delay, func(t *testing.T) {
				ts := newTestServer(t)
				client := freshClient(t)
				var header map[string]string
				if mode == "queued" {
					body := fmt.Sprintf(`{"fault": %q}`, tt.fault)
					if tt.delay != "" {
						body = fmt.Sprintf(`{"fault": %q, "delay": %q}`, tt.fault, tt.delay)
					}
					queue(t, ts, body)
				} else {
					header = map[string]string{headerFault: tt.fault}
					if tt.delay != "" {
						header[headerDelay] = tt.delay
					}
				}

				start := time.Now()
				r, err := trySend(client, "POST", ts.URL+"/charges", `{"orderId": "F-1", "amount": 42}`, header)
				elapsed := time.Since(start)
				switch {
				case tt.wantStatus == 0:
					if err == nil {
						t.Fatalf("POST /charges answered %d %s, want the connection dropped", r.status, r.body)
					}
				case err != nil:
					t.Fatalf("POST /charges: %v", err)
				case tt.wantStatus == http.StatusCreated:
					c := wantCharge(t, r, "F-1", "42")
					if got := listCharges(t, ts).Items; len(got) != 1 || got[0] != c {
						t.Errorf("recorded %+v, want the answered charge %+v", got, c)
					}
				default:
					if p := wantProblem(t, r, tt.wantStatus); p.Fault != tt.fault {
						t.Errorf("problem fault = %q, want %q", p.Fault, tt.fault)
					}
				}
				if err == nil {
					if got := r.header.Get("Retry-After"); got != tt.wantRetryAfter {
						t.Errorf("Retry-After = %q, want %q", got, tt.wantRetryAfter)
					}
				}
				if elapsed < tt.wantMinElapsed {
					t.Errorf("answered after %v, want at least %v", elapsed, tt.wantMinElapsed)
				}

				st := orderCharges(t, ts, "F-1")
				if st.Charges != tt.wantRecorded {
					t.Errorf("recorded charges = %d, want %d", st.Charges, tt.wantRecorded)
				}
				if got := listFaults(t, ts); got.Faults != 0 || len(got.Items) != 0 {
					t.Errorf("fault queue after the request = %+v, want empty", got)
				}

				// The fault applied to one request only.
				wantCharge(t, postCharge(t, ts, `{"orderId": "F-1", "amount": 42}`, nil), "F-1", "42")
				if got := orderCharges(t, ts, "F-1").Charges; got != tt.wantRecorded+1 {
					t.Errorf("recorded charges after a normal request = %d, want %d", got, tt.wantRecorded+1)
				}
			})
		}
	}
}

func TestFaultQueueOrder(t *testing.T) {
	ts := newTestServer(t)
	queue(t, ts, `{"fault": "fail-before-charge", "count": 2}`)
	queue(t, ts, `{"fault": "reject-429"}`)
	queue(t, ts, `{"fault": "delay", "count": 1, "delay": "10ms"}`)

	wantList := faultList{Faults: 4, Items: []faultView{
		{Fault: faultFailBeforeCharge, Count: 2},
		{Fault: faultReject429, Count: 1},
		{Fault: faultDelay, Count: 1, Delay: "10ms"},
	}}
	if got := listFaults(t, ts); got.Faults != wantList.Faults || !slices.Equal(got.Items, wantList.Items) {
		t.Fatalf("GET /faults = %+v, want %+v", got, wantList)
	}

	body := `{"orderId": "Q-1", "amount": 1}`
	wantStatuses := []int{500, 500, 429, 201, 201}
	for i, want := range wantStatuses {
		r := postCharge(t, ts, body, nil)
		if r.status != want {
			t.Errorf("charge %d: status = %d, want %d; body %s", i+1, r.status, want, r.body)
		}
		if i == 0 {
			got := listFaults(t, ts)
			want := faultList{Faults: 3, Items: []faultView{
				{Fault: faultFailBeforeCharge, Count: 1},
				{Fault: faultReject429, Count: 1},
				{Fault: faultDelay, Count: 1, Delay: "10ms"},
			}}
			if got.Faults != want.Faults || !slices.Equal(got.Items, want.Items) {
				t.Errorf("GET /faults after one charge = %+v, want %+v", got, want)
			}
		}
	}
	if got := orderCharges(t, ts, "Q-1").Charges; got != 2 {
		t.Errorf("recorded charges = %d, want 2", got)
	}
}

func TestClearFaults(t *testing.T) {
	ts := newTestServer(t)
	queue(t, ts, `{"fault": "fail-before-charge", "count": 3}`)
	r := send(t, ts.Client(), "DELETE", ts.URL+"/faults", "", nil)
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("DELETE /faults = %d %q, want 204 and no body", r.status, r.body)
	}
	r = send(t, ts.Client(), "GET", ts.URL+"/faults", "", nil)
	wantJSON(t, r, http.StatusOK)
	if got, want := strings.TrimSpace(string(r.body)), `{"faults":0,"items":[]}`; got != want {
		t.Errorf("GET /faults after DELETE = %s, want %s", got, want)
	}
	wantCharge(t, postCharge(t, ts, `{"orderId": "C-1", "amount": 1}`, nil), "C-1", "1")
}

func TestReset(t *testing.T) {
	ts := newTestServer(t)
	wantCharge(t, postCharge(t, ts, `{"orderId": "R-1", "amount": 1}`, nil), "R-1", "1")
	queue(t, ts, `{"fault": "fail-before-charge", "count": 3}`)
	r := send(t, ts.Client(), "POST", ts.URL+"/reset", "", nil)
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("POST /reset = %d %q, want 204 and no body", r.status, r.body)
	}
	if got := listCharges(t, ts); got.Charges != 0 || len(got.Items) != 0 {
		t.Errorf("GET /charges after POST /reset = %+v, want none", got)
	}
	r = send(t, ts.Client(), "GET", ts.URL+"/faults", "", nil)
	wantJSON(t, r, http.StatusOK)
	if got, want := strings.TrimSpace(string(r.body)), `{"faults":0,"items":[]}`; got != want {
		t.Errorf("GET /faults after POST /reset = %s, want %s", got, want)
	}
	// The next charge is recorded: no fault left to fail it.
	wantCharge(t, postCharge(t, ts, `{"orderId": "R-1", "amount": 1}`, nil), "R-1", "1")
	if got := orderCharges(t, ts, "R-1").Charges; got != 1 {
		t.Errorf("statement of R-1 after POST /reset and a new charge has %d charges, want 1", got)
	}
}

func TestHeaderFaultWinsOverQueue(t *testing.T) {
	ts := newTestServer(t)
	queue(t, ts, `{"fault": "fail-before-charge"}`)

	r := postCharge(t, ts, `{"orderId": "H-1", "amount": 1}`, map[string]string{headerFault: faultFailAfterCharge})
	if p := wantProblem(t, r, 500); p.Fault != faultFailAfterCharge {
		t.Errorf("problem fault = %q, want the header's %q", p.Fault, faultFailAfterCharge)
	}
	if got := listFaults(t, ts); got.Faults != 1 {
		t.Errorf("queue after a header fault = %+v, want the queued fault still pending", got)
	}

	r = postCharge(t, ts, `{"orderId": "H-1", "amount": 1}`, nil)
	if p := wantProblem(t, r, 500); p.Fault != faultFailBeforeCharge {
		t.Errorf("problem fault = %q, want the queued %q", p.Fault, faultFailBeforeCharge)
	}
	if got := orderCharges(t, ts, "H-1").Charges; got != 1 {
		t.Errorf("recorded charges = %d, want 1 (fail-after-charge records, fail-before-charge does not)", got)
	}
}

func TestOnlyValidChargesConsumeFaults(t *testing.T) {
	ts := newTestServer(t)
	queue(t, ts, `{"fault": "reject-429"}`)

	send(t, ts.Client(), "GET", ts.URL+"/charges", "", nil)
	send(t, ts.Client(), "GET", ts.URL+"/orders/X/charges", "", nil)
	send(t, ts.Client(), "DELETE", ts.URL+"/charges", "", nil)
	send(t, ts.Client(), "GET", ts.URL+"/healthz", "", nil)
	wantProblem(t, postCharge(t, ts, `{"orderId": "X"}`, nil), 400)
	wantProblem(t, postCharge(t, ts, `{"orderId": "X", "amount": 1}`, map[string]string{headerFault: "bogus"}), 400)

	if got := listFaults(t, ts); got.Faults != 1 {
		t.Fatalf("queue = %+v, want the fault still pending", got)
	}
	wantProblem(t, postCharge(t, ts, `{"orderId": "X", "amount": 1}`, nil), 429)
	if got := listFaults(t, ts); got.Faults != 0 {
		t.Errorf("queue after a charge = %+v, want empty", got)
	}
}

func TestQueueFault(t *testing.T) {
	tests := []struct {
		name string
		body string
		want faultView
	}{
		{"count defaults to 1", `{"fault": "fail-after-charge"}`, faultView{Fault: faultFailAfterCharge, Count: 1}},
		{"explicit count", `{"fault": "reject-429", "count": 5}`, faultView{Fault: faultReject429, Count: 5}},
		{"delay", `{"fault": "delay", "delay": "3s"}`, faultView{Fault: faultDelay, Count: 1, Delay: "3s"}},
		{"zero delay", `{"fault": "delay", "delay": "0s"}`, faultView{Fault: faultDelay, Count: 1, Delay: "0s"}},
		{"delay ignored by other faults", `{"fault": "drop-after-charge", "delay": "later"}`, faultView{Fault: faultDropAfterCharge, Count: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t)
			r := send(t, ts.Client(), "POST", ts.URL+"/faults", tt.body, nil)
			wantJSON(t, r, http.StatusCreated)
			want := faultList{Faults: tt.want.Count, Items: []faultView{tt.want}}
			for name, got := range map[string]faultList{"POST answer": decode[faultList](t, r), "GET /faults": listFaults(t, ts)} {
				if got.Faults != want.Faults || !slices.Equal(got.Items, want.Items) {
					t.Errorf("%s = %+v, want %+v", name, got, want)
				}
			}
		})
	}
}

func TestQueueFaultBadInput(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		status int
	}{
		{"not JSON", `fault=delay`, 400},
		{"empty body", ``, 400},
		{"JSON array", `[]`, 400},
		{"missing fault", `{"count": 1}`, 400},
		{"fault not a string", `{"fault": 1}`, 400},
		{"unknown fault", `{"fault": "explode"}`, 400},
		{"zero count", `{"fault": "reject-429", "count": 0}`, 400},
		{"negative count", `{"fault": "reject-429", "count": -1}`, 400},
		{"fractional count", `{"fault": "reject-429", "count": 1.5}`, 400},
		{"string count", `{"fault": "reject-429", "count": "2"}`, 400},
		{"count too large", fmt.Sprintf(`{"fault": "reject-429", "count": %d}`, maxFaultCount+1), 400},
		{"missing delay", `{"fault": "delay"}`, 400},
		{"empty delay", `{"fault": "delay", "delay": ""}`, 400},
		{"unparsable delay", `{"fault": "delay", "delay": "soon"}`, 400},
		{"negative delay", `{"fault": "delay", "delay": "-1s"}`, 400},
		{"numeric delay", `{"fault": "delay", "delay": 3}`, 400},
		{"body too large", `{"fault": "delay", "pad": "` + strings.Repeat("x", maxBodyBytes) + `"}`, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := newTestServer(t)
			wantProblem(t, send(t, ts.Client(), "POST", ts.URL+"/faults", tt.body, nil), tt.status)
			if got := listFaults(t, ts); got.Faults != 0 || len(got.Items) != 0 {
				t.Errorf("queue after a rejected POST /faults = %+v, want empty", got)
			}
		})
	}
}

func TestDelayFaultRespectsCancellation(t *testing.T) {
	h := New(testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, "POST", "/charges", strings.NewReader(`{"orderId": "D-1", "amount": 1}`))
	req.Header.Set(headerFault, faultDelay)
	req.Header.Set(headerDelay, "1h")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, req)
	}()

	recorded := func() int {
		r := httptest.NewRecorder()
		h.ServeHTTP(r, httptest.NewRequest("GET", "/orders/D-1/charges", nil))
		var st statement
		if err := json.Unmarshal(r.Body.Bytes(), &st); err != nil {
			t.Fatalf("decode statement %s: %v", r.Body, err)
		}
		return st.Charges
	}
	for deadline := time.Now().Add(5 * time.Second); recorded() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the delayed charge was not recorded within 5s")
		}
	}

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler still waits 5s after the request was canceled")
	}
	if rec.Body.Len() != 0 {
		t.Errorf("a canceled delayed request wrote %q, want nothing", rec.Body)
	}
	if got := recorded(); got != 1 {
		t.Errorf("recorded charges after the cancel = %d, want 1", got)
	}
}

func TestDelayFaultOutlastsServerTimeouts(t *testing.T) {
	ts := httptest.NewUnstartedServer(New(testLogger(t)))
	ts.Config.ReadTimeout = 100 * time.Millisecond
	ts.Config.WriteTimeout = 100 * time.Millisecond
	ts.Start()
	t.Cleanup(ts.Close)

	r, err := trySend(freshClient(t), "POST", ts.URL+"/charges", `{"orderId": "D-2", "amount": 1}`,
		map[string]string{headerFault: faultDelay, headerDelay: "400ms"})
	if err != nil {
		t.Fatalf("a delay longer than the server timeouts failed: %v", err)
	}
	wantCharge(t, r, "D-2", "1")
}

func TestConcurrentCharges(t *testing.T) {
	const n, orders = 200, 10
	ts := newTestServer(t)

	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"orderId": "order-%d", "amount": %d}`, i%orders, i+1)
			r, err := trySend(ts.Client(), "POST", ts.URL+"/charges", body, nil)
			if err != nil {
				t.Errorf("charge %d: %v", i, err)
				return
			}
			if r.status != http.StatusCreated {
				t.Errorf("charge %d: status = %d, want 201; body %s", i, r.status, r.body)
				return
			}
			var c charge
			if err := json.Unmarshal(r.body, &c); err != nil {
				t.Errorf("charge %d: decode %s: %v", i, r.body, err)
				return
			}
			ids[i] = c.ChargeID
		})
	}
	wg.Wait()

	seen := make(map[string]bool, n)
	for i, id := range ids {
		if seen[id] {
			t.Errorf("charge %d: chargeId %q is not unique", i, id)
		}
		seen[id] = true
	}
	all := listCharges(t, ts)
	if all.Charges != n || len(all.Items) != n {
		t.Errorf("GET /charges = %d charges (%d items), want %d", all.Charges, len(all.Items), n)
	}
	for _, c := range all.Items {
		if !seen[c.ChargeID] {
			t.Errorf("recorded chargeId %q was not answered to any request", c.ChargeID)
		}
	}
	for o := range orders {
		if got := orderCharges(t, ts, fmt.Sprintf("order-%d", o)).Charges; got != n/orders {
			t.Errorf("statement of order-%d has %d charges, want %d", o, got, n/orders)
		}
	}
}

func TestConcurrentChargesConsumeQueueExactly(t *testing.T) {
	const n, failures = 200, 50
	ts := newTestServer(t)
	queue(t, ts, fmt.Sprintf(`{"fault": "fail-before-charge", "count": %d}`, failures))

	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := trySend(ts.Client(), "POST", ts.URL+"/charges", `{"orderId": "storm", "amount": 1}`, nil)
			if err != nil {
				t.Errorf("charge %d: %v", i, err)
				return
			}
			mu.Lock()
			statuses[r.status]++
			mu.Unlock()
		})
	}
	wg.Wait()

	want := map[int]int{500: failures, 201: n - failures}
	if fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("statuses = %v, want %v", statuses, want)
	}
	if got := orderCharges(t, ts, "storm").Charges; got != n-failures {
		t.Errorf("recorded charges = %d, want %d", got, n-failures)
	}
	if got := listFaults(t, ts); got.Faults != 0 {
		t.Errorf("queue after the storm = %+v, want empty", got)
	}
}

func TestPositive(t *testing.T) {
	tests := []struct {
		n    json.Number
		want bool
	}{
		{"1", true}, {"0.01", true}, {"10.50", true}, {"1e-400", true}, {"1E+3", true}, {"0.0001e2", true},
		{"0", false}, {"0.000", false}, {"0e10", false}, {"0E-1", false}, {"-0", false}, {"-1", false}, {"-0.5e3", false},
	}
	for _, tt := range tests {
		if got := positive(tt.n); got != tt.want {
			t.Errorf("positive(%s) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

func TestCreateChargeForOrderInPath(t *testing.T) {
	ts := httptest.NewServer(New(testLogger(t)))
	defer ts.Close()
	tests := []struct {
		name, path, body string
		want             int
	}{
		{"order from path", "/orders/ORD-7/charges", `{"amount": 5}`, http.StatusCreated},
		{"matching order in body", "/orders/ORD-7/charges", `{"orderId": "ORD-7", "amount": 5}`, http.StatusCreated},
		{"conflicting order in body", "/orders/ORD-7/charges", `{"orderId": "ORD-8", "amount": 5}`, http.StatusBadRequest},
		{"bad amount", "/orders/ORD-7/charges", `{"amount": 0}`, http.StatusBadRequest},
	}
	for _, tt := range tests {
		resp, err := http.Post(ts.URL+tt.path, "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s: status = %d, want %d", tt.name, resp.StatusCode, tt.want)
		}
	}
	resp, err := http.Get(ts.URL + "/orders/ORD-7/charges")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Charges int }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.Charges != 2 {
		t.Errorf("ORD-7 charges = %d, want 2", st.Charges)
	}
}
