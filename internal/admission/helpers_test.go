package admission

import (
	"net/http"
	"strconv"
)

// testAnswers stand for the proxy's problem answers (the program wires
// those; admission does not import the proxy): a 503 with Retry-After: 1,
// and a 431 that closes the connection.
var testAnswers = Answers{
	Overloaded: func(w http.ResponseWriter, r *http.Request, detail string, ext map[string]any) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "overloaded: "+detail, http.StatusServiceUnavailable)
	},
	HeaderFields: func(max int) []byte {
		body := "more than " + strconv.Itoa(max) + " header lines"
		return []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	},
}
