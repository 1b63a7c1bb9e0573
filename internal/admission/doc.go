// Package admission decides what idemproxy takes in, and how much of it,
// before a request reaches the upstream: the model of docs/admission.md,
// one file per part of it.
//
//   - limiter.go: Limiter, the client listener's connections
//     (server.max_connections; the oldest idle connection is shed for a
//     newcomer) and requests in flight, with Guard applying the per-client
//     limits to each request ("Connections", "One client, many streams");
//     the admin listener's fair limiter (NewAdminLimiter); and the HTTP/1
//     header-line bound, 431 past 256 lines as they are read (step 3 of
//     the order).
//   - clients.go: the per-client table, requests in flight
//     (server.max_requests_per_client) and HTTP/2 resets judged against
//     the streams opened (server.max_client_resets_per_second), bounded in
//     memory ("One client, many streams").
//   - overload.go: the bounds over all clients, whatever their address:
//     HTTP/2 resets over all connections (server.max_resets_per_second)
//     and the live heap against memory_limit ("Many clients at once").
//   - h2frames.go: the frame headers of each HTTP/2 connection followed on
//     its read path, for CONTINUATION floods and RST_STREAM counts
//     ("CONTINUATION floods", "Resets are counted as they arrive").
//   - http2.go: the header size, the HTTP/2 settings per connection and
//     cleartext HTTP/2 with prior knowledge, h2c upgrades taken out
//     ("Cleartext HTTP/2").
//   - budget.go: Budget, the bytes buffered at once
//     (server.max_buffered_bytes) and each client's share of them, the
//     client a request counts as (ClientOf), and how a body is charged as
//     its bytes arrive ("The buffer budget"). The proxy owns one and
//     charges request bodies and copies of answers to it.
//   - metrics.go: the metrics of all of the above ("Metrics and alerts").
//
// The answers the limits give (503 overloaded, 431) are RFC 9457 problems
// written by internal/problem, the proxy's and the admin API's writer too.
// The proxy imports this package, never the reverse.
package admission
