package reconcile

import "testing"

func TestLookupURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path, key, want string
		err             bool
	}{
		{"/orders/{key}/charge", "ORD-1", "http://up/orders/ORD-1/charge", false},
		{"/orders/{key}/charge", "A/B", "http://up/orders/A%2FB/charge", false},
		{"/orders/{key}/charge", "a?b#c", "http://up/orders/a%3Fb%23c/charge", false},
		{"/orders/{key}/charge", "100%", "http://up/orders/100%25/charge", false},
		{"/orders/{key}/charge", "x|y", "http://up/orders/x%7Cy/charge", false},
		{"/orders/{key}/charge", "..", "", true},
		{"/orders/{key}/charge", ".", "", true},
		{"/orders/{key}/charge", "...", "http://up/orders/.../charge", false},
		{"/charges?order={key}", "x&order=y", "http://up/charges?order=x%26order%3Dy", false},
		{"/charges?order={key}", "a b", "http://up/charges?order=a+b", false},
	}
	for _, tt := range tests {
		u, err := lookupURL("http://up", tt.path, tt.key)
		if tt.err {
			if err == nil {
				t.Errorf("lookupURL(%q, %q) = %v, want an error", tt.path, tt.key, u)
			}
			continue
		}
		if err != nil || u.String() != tt.want {
			t.Errorf("lookupURL(%q, %q) = %v, %v; want %s", tt.path, tt.key, u, err, tt.want)
		}
	}
}
