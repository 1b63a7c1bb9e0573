package keyextract

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestExtractJSONNameInAnotherCase: a member whose name differs from the
// key path only in letter case is the key, as a Go upstream decodes it; a
// name present in two cases is ambiguous. Neither may be "missing", which
// on_missing_key: forward would forward unprotected.
func TestExtractJSONNameInAnotherCase(t *testing.T) {
	orderAndCharge := Spec{Parts: []Source{{Kind: JSON, Name: "orderId"}, {Kind: JSON, Name: "order.charge"}}}
	tests := []extractCase{
		{name: "capitalised", spec: jsonKey("orderId"), body: `{"OrderId": "X"}`, want: "X"},
		{name: "upper case", spec: jsonKey("orderId"), body: `{"ORDERID": 7}`, want: "7"},
		{name: "escaped name", spec: jsonKey("orderId"), body: `{"Order\u0049d": "X"}`, want: "X"},
		{name: "Kelvin sign folds to k", spec: jsonKey("key"), body: `{"\u212aey": "X"}`, want: "X"},
		{name: "nested", spec: jsonKey("order.id"), body: `{"Order": {"ID": "X"}}`, want: "X"},
		{name: "nested in array", spec: jsonKey("items.0.sku"), body: `{"Items": [{"Sku": "S"}]}`, want: "S"},
		{name: "composite", spec: orderAndCharge, body: `{"orderid": 1, "ORDER": {"Charge": "c"}}`, want: "1|c"},
		{name: "exact match still works", spec: jsonKey("orderId"), body: `{"orderId": "X", "other": 1}`, want: "X"},
		{name: "two cases: ambiguous", spec: jsonKey("orderId"), body: `{"orderId": "A", "OrderId": "B"}`, wantErr: errInvalid},
		{name: "two cases nested: ambiguous", spec: jsonKey("order.id"), body: `{"order": {"id": "A", "Id": "B"}}`, wantErr: errInvalid},
		{name: "two cases in a composite", spec: orderAndCharge, body: `{"orderId": 1, "order": {"charge": "a", "CHARGE": "b"}}`, wantErr: errInvalid},
		{name: "really missing", spec: jsonKey("orderId"), body: `{"order": "X"}`, wantErr: ErrMissing},
		{name: "index on an object is a name", spec: jsonKey("items.0"), body: `{"items": {"0": "X"}}`, want: "X"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runExtract(t, tc, newRequest(tc))
		})
	}
}

// TestExtractJSONAgreesWithEncodingJSON: whatever key a Go upstream decodes
// from a body is the key the proxy protects it under.
func TestExtractJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, body := range []string{
		`{"orderId": "A"}`, `{"OrderID": "A"}`, `{"oRdErId": "A"}`, `{"order_id": "A"}`,
		`{"orderıd": "A"}`, `{"orderſd": "A"}`, `{"ORDERİD": "A"}`,
	} {
		var up struct{ OrderID string }
		if err := json.Unmarshal([]byte(body), &up); err != nil {
			t.Fatal(err)
		}
		r, _ := http.NewRequest("POST", "/charges", nil)
		got, err := jsonKey("orderId").Extract(r, []byte(body))
		if up.OrderID != "" && got != up.OrderID {
			t.Errorf("%s: the upstream reads orderId %q, the proxy key is %q (%v)", body, up.OrderID, got, err)
		}
		if up.OrderID == "" && err == nil {
			t.Errorf("%s: the upstream reads no orderId, the proxy key is %q", body, got)
		}
	}
}
