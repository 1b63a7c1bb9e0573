package keyextract_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemproxy/idemproxy/keyextract"
)

func ExampleSpec_Extract() {
	spec := keyextract.Spec{Parts: []keyextract.Source{{Kind: keyextract.JSON, Name: "orderId"}}}
	for _, body := range []string{`{"orderId":1001}`, `{"orderId":"1001"}`, `{"orderId":null}`, `{"orderId":{"id":1}}`} {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		key, err := spec.Extract(r, []byte(body))
		switch {
		case errors.Is(err, keyextract.ErrMissing):
			fmt.Println("missing:", err)
		case err != nil:
			fmt.Println("invalid:", err)
		default:
			fmt.Println("key:", key)
		}
	}
	// Output:
	// key: 1001
	// key: 1001
	// missing: key json orderId: missing
	// invalid: key json orderId: invalid: an object or array is not a key
}

// A composite key escapes '%' and '|' in each part, so that its parts can
// never run into one another.
func ExampleSpec_Extract_composite() {
	spec := keyextract.Spec{Parts: []keyextract.Source{
		{Kind: keyextract.Path, Name: "id"},
		{Kind: keyextract.Header, Name: "X-Charge"},
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/charges", func(w http.ResponseWriter, r *http.Request) {
		key, err := spec.Extract(r, nil)
		fmt.Println(key, err)
	})
	r := httptest.NewRequest(http.MethodPost, "/orders/1001/charges", nil)
	r.Header.Set("X-Charge", "deposit|2")
	mux.ServeHTTP(httptest.NewRecorder(), r)
	// Output:
	// 1001|deposit%7C2 <nil>
}

func ExampleCanonicalize() {
	body := []byte(`{
		"orderId": 1001,
		"items": [{"sku": "A-1", "ts": 5}],
		"amount": 12.50,
		"sentAt": "2024-05-01T10:00:00Z"
	}`)
	out, err := keyextract.Canonicalize(body, []string{"sentAt", "items.0.ts"})
	fmt.Println(string(out), err)

	_, err = keyextract.Canonicalize([]byte(`{"orderId":1,"orderId":2}`), nil)
	fmt.Println(err)
	// Output:
	// {"amount":12.5,"items":[{"sku":"A-1"}],"orderId":1001} <nil>
	// body is not valid JSON: the name "orderId" appears twice in one object
}

func ExampleFingerprint() {
	ignore := []string{"sentAt"}
	a, _ := keyextract.Fingerprint("POST", "/charges", []byte(`{"orderId":1001,"amount":5,"sentAt":"10:00"}`), ignore)
	b, _ := keyextract.Fingerprint("POST", "/charges", []byte(`{ "amount": 5, "orderId": 1001, "sentAt": "10:05" }`), ignore)
	c, _ := keyextract.Fingerprint("POST", "/charges", []byte(`{"orderId":1001,"amount":7,"sentAt":"10:00"}`), ignore)
	fmt.Println("retry is the same request:", a == b)
	fmt.Println("other amount is the same request:", a == c)

	_, jsonErr := keyextract.Fingerprint("POST", "/charges", []byte("orderId=1001"), nil)
	fmt.Println(jsonErr)
	// Output:
	// retry is the same request: true
	// other amount is the same request: false
	// body is not valid JSON: invalid character 'o' looking for beginning of value
}

// A route compiles its ignored paths once and fingerprints every request
// with them; the fingerprint is the one Fingerprint gives.
func ExampleFingerprintIgnoring() {
	ignore := keyextract.CompileIgnore([]string{"sentAt"})
	body := []byte(`{"orderId":1001,"amount":5,"sentAt":"10:00"}`)
	a, _ := keyextract.FingerprintIgnoring("POST", "/charges", body, ignore)
	b, _ := keyextract.Fingerprint("POST", "/charges", body, []string{"sentAt"})
	fmt.Println(a == b)
	// Output:
	// true
}
