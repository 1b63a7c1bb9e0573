package admin_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/admin"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
)

// An operator inspects a key that is stuck in doubt after an incident and
// releases it so that the client's retry is processed again.
func ExampleNewHandler() {
	dir, err := os.MkdirTemp("", "idemproxy-admin-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()

	// The proxy reserved the key, then lost the upstream's answer.
	ctx := context.Background()
	sk := store.Key("charges", "", "order-42")
	st.Reserve(ctx, sk, store.Reservation{Token: "t", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	st.MarkInDoubt(ctx, sk, "t", time.Hour)

	h := admin.NewHandler(admin.Options{
		Store:    st,
		Routes:   routes{"charges": ""},
		Gatherer: prometheus.NewRegistry(),
		Token:    "s3cret", // from $IDEMPROXY_ADMIN_TOKEN
	})
	call := func(method, target string) {
		req := httptest.NewRequest(method, target, nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		req.Header.Set("X-Operator", "alice")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(method, target, rec.Code)
	}
	call(http.MethodGet, "/v1/keys/charges/order-42")
	call(http.MethodDelete, "/v1/keys/charges/order-42?reason=INC-7")
	call(http.MethodGet, "/v1/keys/charges/order-42")
	// Output:
	// GET /v1/keys/charges/order-42 200
	// DELETE /v1/keys/charges/order-42?reason=INC-7 200
	// GET /v1/keys/charges/order-42 404
}
