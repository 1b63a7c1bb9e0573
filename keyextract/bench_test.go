package keyextract

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkFingerprint measures the fingerprint of 1 MiB bodies of the
// shapes that cost most: many small objects, many numbers, deep nesting.
func BenchmarkFingerprint(b *testing.B) {
	var objects, numbers strings.Builder
	objects.WriteString("[")
	numbers.WriteString("[")
	for i := 0; objects.Len() < 1<<20; i++ {
		if i > 0 {
			objects.WriteString(",")
		}
		fmt.Fprintf(&objects, `{"sku":"S-%d","qty":%d,"price":"%d.50"}`, i, i%7, i)
	}
	for i := 0; numbers.Len() < 1<<20; i++ {
		if i > 0 {
			numbers.WriteString(",")
		}
		fmt.Fprintf(&numbers, "%d", i)
	}
	objects.WriteString("]")
	numbers.WriteString("]")
	deep := strings.Repeat(`{"a":`, maxDepth-1) + `"` + strings.Repeat("x", 1<<20) + `"` + strings.Repeat("}", maxDepth-1)
	for _, tc := range []struct{ name, body string }{
		{"objects-1MiB", objects.String()},
		{"numbers-1MiB", numbers.String()},
		{"deep-1MiB", deep},
		{"charge", `{"orderId":"ORD-1","amount":10,"sentAt":"2026-11-30T10:00:00Z"}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Fingerprint("POST", "/charges", body, []string{"sentAt"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFingerprintSmall measures the fingerprint of a typical small
// request body with one ignored path: the per-request cost on the hot path.
func BenchmarkFingerprintSmall(b *testing.B) {
	body := []byte(`{"orderId": "B-1", "amount": 10, "sentAt": "2026-11-30T10:00:00Z"}`)
	ignore := CompileIgnore([]string{"sentAt"}) // as a route does, once
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FingerprintIgnoring("POST", "/charges", body, ignore); err != nil {
			b.Fatal(err)
		}
	}
}
