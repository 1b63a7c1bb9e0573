package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/internal/epoch"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// TestAcceptLoss: POST /v1/store/accept-loss is behind the token, writes
// an accepted epoch over the lost marker of the real Badger store, answers
// what it replaced, and writes one audit line naming the operator, the
// reason and the epochs, like a release; a store that fails is 503, and
// without AcceptLoss the endpoint does not exist.
func TestAcceptLoss(t *testing.T) {
	st := openLostStore(t)
	ctx := context.Background()
	var logs bytes.Buffer
	fail := false
	h := newHandler(t, st, func(o *admin.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		o.AcceptLoss = func(ctx context.Context, operator, reason string) (*store.Epoch, *store.Epoch, error) {
			if fail {
				return nil, nil, errors.New("badger: database is closed")
			}
			return epoch.Accept(ctx, st, operator, reason, time.Now(), 0)
		}
	})
	for _, auth := range []string{"", "Bearer wrong"} {
		rec := serve(t, h, http.MethodPost, "/v1/store/accept-loss", auth, nil)
		checkProblem(t, rec, "/v1/store/accept-loss", http.StatusUnauthorized, "unauthorized")
	}
	if got, _ := st.Epoch(ctx); got == nil || got.ID != "lost-1" {
		t.Fatalf("a refused acceptance changed the marker: %+v", got)
	}
	if rec := serve(t, h, http.MethodGet, "/v1/store/accept-loss", bearer, nil); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET = %d, want 405", rec.Code)
	}
	// Refused requests write no audit line; each wrong or missing token
	// writes its own warning.
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.Contains(l, `"msg":"admin authentication failed"`) {
			t.Fatalf("log before any acceptance, want only the failed authentications:\n%s", logs.String())
		}
	}
	logs.Reset()

	rec := serve(t, h, http.MethodPost, "/v1/store/accept-loss?reason=redis+flushed", bearer, http.Header{"X-Operator": {"alice"}})
	if rec.Code != http.StatusOK {
		t.Fatalf("POST = %d %s, want 200", rec.Code, rec.Body)
	}
	var body struct {
		Accepted      bool   `json:"accepted"`
		Epoch         string `json:"epoch"`
		Gen           uint64 `json:"gen"`
		PreviousEpoch string `json:"previous_epoch"`
		PreviousState string `json:"previous_state"`
	}
	decode(t, rec, &body)
	got, _ := st.Epoch(ctx)
	if !body.Accepted || got == nil || body.Epoch != got.ID || got.State != store.EpochAccepted || body.Gen <= lostGen ||
		body.PreviousEpoch != "lost-1" || body.PreviousState != "lost" {
		t.Errorf("answer %+v, marker %+v; want the new accepted marker, above gen 7, replacing lost-1", body, got)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", len(lines), logs.String())
	}
	var line map[string]any
	json.Unmarshal([]byte(lines[0]), &line)
	for k, w := range map[string]string{"level": "WARN", "operator": "alice", "reason": "redis flushed",
		"previous_epoch": "lost-1", "previous_state": "lost", "epoch": got.ID, "via": "admin"} {
		if g, _ := line[k].(string); g != w {
			t.Errorf("audit %s = %q, want %q", k, g, w)
		}
	}

	fail = true
	rec = serve(t, h, http.MethodPost, "/v1/store/accept-loss", bearer, nil)
	checkProblem(t, rec, "/v1/store/accept-loss", http.StatusServiceUnavailable, "store-unavailable")

	without := newHandler(t, st, nil)
	rec = serve(t, without, http.MethodPost, "/v1/store/accept-loss", bearer, nil)
	checkProblem(t, rec, "/v1/store/accept-loss", http.StatusNotFound, "not-found")
}

// TestAcceptLossTextIsBounded: accept-loss's X-Operator and reason go to
// the audit line and the stored marker as a release's do, so they are
// held to the same rules: refused 400 with the marker left lost and no
// audit line.
func TestAcceptLossTextIsBounded(t *testing.T) {
	st := openLostStore(t)
	ctx := context.Background()
	var logs bytes.Buffer
	h := newHandler(t, st, func(o *admin.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		o.AcceptLoss = func(ctx context.Context, operator, reason string) (*store.Epoch, *store.Epoch, error) {
			return epoch.Accept(ctx, st, operator, reason, time.Now(), 0)
		}
	})
	for _, tc := range []struct {
		name, reason, operator string
	}{
		{"long reason", strings.Repeat("r", 1001), ""},
		{"newline in reason", "INC-1\nlevel=INFO msg=fine", ""},
		{"bidi in reason", "INC-1 \u202eko", ""},
		{"not UTF-8 reason", "INC-\xff", ""},
		{"bidi in operator", "INC-1", "eve\u202eecila"},
		{"long operator", "INC-1", strings.Repeat("o", 129)},
	} {
		logs.Reset()
		hdr := http.Header{}
		if tc.operator != "" {
			hdr.Set("X-Operator", tc.operator)
		}
		target := "/v1/store/accept-loss?reason=" + url.QueryEscape(tc.reason)
		checkProblem(t, serve(t, h, http.MethodPost, target, bearer, hdr), "/v1/store/accept-loss", http.StatusBadRequest, "invalid-parameter")
		if got, _ := st.Epoch(ctx); got == nil || got.ID != "lost-1" || got.State != store.EpochLost {
			t.Errorf("%s: marker %+v, want lost-1 still lost", tc.name, got)
		}
		if logs.Len() != 0 {
			t.Errorf("%s: log %s, want none", tc.name, logs.String())
		}
	}
	// The rules refuse only what the line could not hold: a plain reason
	// and operator are accepted.
	rec := serve(t, h, http.MethodPost, "/v1/store/accept-loss?reason=INC-9", bearer, http.Header{"X-Operator": {"dana"}})
	if rec.Code != http.StatusOK {
		t.Fatalf("a plain acceptance = %d %s, want 200", rec.Code, rec.Body)
	}
}

// lostGen is the generation of openLostStore's marker.
const lostGen = 7

// openLostStore opens a Badger store whose epoch marker, lost-1 at
// generation lostGen, says it lost its keys.
func openLostStore(t *testing.T) *badger.Store {
	t.Helper()
	st := openStore(t)
	lost := store.Epoch{ID: "lost-1", State: store.EpochLost, Gen: lostGen, CreatedAt: time.Now()}
	if _, ok, err := st.SwapEpoch(context.Background(), "", lost); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	return st
}
