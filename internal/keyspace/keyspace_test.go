package keyspace_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/internal/keyspace"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// routes parses a configuration of the given routes (YAML list items).
func routes(t *testing.T, items string) []config.Route {
	t.Helper()
	c, err := config.Parse([]byte("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:9000\nroutes:\n" + items))
	if err != nil {
		t.Fatal(err)
	}
	return c.Routes
}

// openStore opens a Badger store of the test's own, closed with it.
func openStore(t *testing.T) *badger.Store {
	t.Helper()
	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

const (
	charges   = "  - {name: charges, match: POST /charges, key: {json: orderId}}\n"
	renamed   = "  - {name: charges-v2, match: POST /charges, key: {json: orderId}}\n"
	kept      = "  - {name: charges-v2, keyspace: charges, match: POST /charges, key: {json: orderId}}\n"
	byHeader  = "  - {name: charges, match: POST /charges, key: {header: Idempotency-Key}}\n"
	scoped    = "  - {name: charges, match: POST /charges, key: {json: orderId}, scope: {header: X-Api-Key}}\n"
	nfc       = "  - {name: charges, match: POST /charges, key: {json: orderId, normalize: nfc}}\n"
	refunds   = "  - {name: refunds, match: POST /refunds, key: {json: orderId}}\n"
	noCharges = refunds
)

// TestCheck: what a configuration finds against a registry recorded by
// the one before, with and without live keys in the old keyspace; each
// case records `before`, optionally reserves a key in it, and checks
// `after`.
func TestCheck(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name          string
		before, after string
		live          bool
		held          []string // routes held
		unclaimed     string   // a finding about a keyspace no route claims
		record        []string // keyspaces Check asks to record
	}{
		{"same configuration", charges, charges, true, nil, "", nil},
		{"renamed, keys live", charges, renamed, true, []string{"charges-v2"}, "", nil},
		{"renamed, no live keys", charges, renamed, false, nil, "", []string{"charges-v2"}},
		{"renamed, keyspace kept", charges, kept, true, nil, "", []string{"charges"}},
		{"key from a header now", charges, byHeader, true, []string{"charges"}, "", nil},
		{"scope added", charges, scoped, true, []string{"charges"}, "", nil},
		{"key changed, no live keys", charges, byHeader, false, nil, "", []string{"charges"}},
		{"nfc turned on", charges, nfc, true, nil, "", []string{"charges"}},
		{"nfc turned off", nfc, charges, true, []string{"charges"}, "", nil},
		{"route removed, keys live", charges + refunds, noCharges, true, nil, "charges", nil},
		{"route removed, no live keys", charges + refunds, noCharges, false, nil, "", nil},
		{"route added", charges, charges + refunds, true, nil, "", []string{"refunds"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := openStore(t)
			first, err := keyspace.Check(ctx, st, routes(t, tt.before), time.Now())
			if err != nil || len(first.Findings) != 0 {
				t.Fatalf("first check = %+v, %v; want no findings", first, err)
			}
			if err := keyspace.Record(ctx, st, first); err != nil {
				t.Fatal(err)
			}
			if tt.live {
				res := store.Reservation{Token: "t", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
				if _, err := st.Reserve(ctx, store.Key("charges", "", "ORD-1"), res); err != nil {
					t.Fatal(err)
				}
			}
			got, err := keyspace.Check(ctx, st, routes(t, tt.after), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			var held []string
			unclaimed := ""
			for _, f := range got.Findings {
				if f.Route == "" {
					unclaimed = f.Keyspace
				} else {
					held = append(held, f.Route)
				}
				if !strings.Contains(f.Error(), "drop-keyspace") {
					t.Errorf("finding %q names no fix", f.Error())
				}
			}
			var record []string
			for _, k := range got.Record {
				record = append(record, k.Name)
			}
			if strings.Join(held, ",") != strings.Join(tt.held, ",") || unclaimed != tt.unclaimed || strings.Join(record, ",") != strings.Join(tt.record, ",") {
				t.Errorf("held %v, unclaimed %q, record %v; want %v, %q, %v\n(findings: %v)", held, unclaimed, record, tt.held, tt.unclaimed, tt.record, got.Err())
			}
		})
	}
}

// TestFindingsSayTheFix: a rename names the route, both keyspaces, the
// live keys and both fixes.
func TestFindingsSayTheFix(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	first, _ := keyspace.Check(ctx, st, routes(t, charges), time.Now())
	keyspace.Record(ctx, st, first)
	st.Reserve(ctx, store.Key("charges", "", "ORD-1"), store.Reservation{Token: "t", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
	res, err := keyspace.Check(ctx, st, routes(t, renamed), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	msg := res.Err().Error()
	for _, want := range []string{"route charges-v2", "keyspace charges-v2", "keyspace charges (routes charges) has live keys",
		"keyspace: charges on route charges-v2", "idemproxy keys drop-keyspace charges -reason"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the finding %q does not say %q", msg, want)
		}
	}
}

// TestUpgradeRecordsWhatRuns: a store written by a release without the
// registry holds keys but no entry; the first check records the routes it
// runs, and finds nothing (a rename in the same deploy is not caught, as
// the docs say), and a rename after that is.
func TestUpgradeRecordsWhatRuns(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	res := store.Reservation{Token: "t", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
	if _, err := st.Reserve(ctx, store.Key("charges", "", "ORD-1"), res); err != nil {
		t.Fatal(err)
	}
	first, err := keyspace.Check(ctx, st, routes(t, charges), time.Now())
	if err != nil || len(first.Findings) != 0 || len(first.Record) != 1 || first.Record[0].Name != "charges" {
		t.Fatalf("first check after the upgrade = %+v, %v; want charges recorded, no finding", first, err)
	}
	if err := keyspace.Record(ctx, st, first); err != nil {
		t.Fatal(err)
	}
	if got, err := keyspace.Check(ctx, st, routes(t, renamed), time.Now()); err != nil || len(got.Findings) != 1 || got.Findings[0].Route != "charges-v2" {
		t.Errorf("a rename after the upgrade = %+v, %v; want charges-v2 held", got, err)
	}
}
