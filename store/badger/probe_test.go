package badger_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// TestRestartLeavesProbeReservationsAlone: a write probe's reservation
// left in flight by a crash is no request's: the restart neither counts it
// among the reservations now in doubt nor turns it in doubt, while a
// request's reservation is both.
func TestRestartLeavesProbeReservationsAlone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := badger.Open(badger.Options{Dir: dir, SyncWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res := store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
	probe, request := store.Key(store.ProbeRoute, "", "p1"), store.Key("charges", "", "ORD-1")
	for _, k := range []string{probe, request} {
		if rec, err := s.Reserve(ctx, k, res); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %v, %v", k, rec, err)
		}
	}
	s.Close()

	var logs bytes.Buffer
	s, err = badger.Open(badger.Options{Dir: dir, SyncWrites: true, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.Contains(logs.String(), `"msg":"reservations left in flight by the previous process are now in doubt","keys":1`) {
		t.Errorf("log at restart, want one reservation now in doubt (the request's):\n%s", logs.String())
	}
	for k, want := range map[string]store.State{probe: store.StateInFlight, request: store.StateInDoubt} {
		if rec, err := s.Get(ctx, k); err != nil || rec == nil || rec.State != want {
			t.Errorf("Get(%s) after restart = %+v, %v; want %s", k, rec, err, want)
		}
	}
}
