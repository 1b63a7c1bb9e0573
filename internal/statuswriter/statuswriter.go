// Package statuswriter remembers the status of an answer written through
// an http.ResponseWriter, for the proxy's pass-through requests and the
// admin listener's spans.
package statuswriter

import "net/http"

// Writer is an http.ResponseWriter that remembers the final status written
// through it. An informational answer (100 Continue, 103 Early Hints)
// passed on before the final one is not the request's status; 101
// Switching Protocols is final. A Write before any WriteHeader is a 200.
//
// Status is 0 while nothing final has been written.
type Writer struct {
	http.ResponseWriter
	Status int
}

// WriteHeader passes code on and remembers it when it is the first final
// status.
func (w *Writer) WriteHeader(code int) {
	if w.Status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write passes b on; written before a final status, the status is 200.
func (w *Writer) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (to flush, to
// set deadlines, to hijack an upgraded connection).
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
