package admission

import (
	"errors"
	"net"
)

// Bounds on runs of HTTP/2 CONTINUATION frames. A header block is one
// HEADERS frame and the CONTINUATION frames that follow it, with no other
// frame between them. Go's server bounds the header bytes a block decodes
// to (SETTINGS_MAX_HEADER_LIST_SIZE, the fix of CVE-2023-45288) but not
// the frames: empty CONTINUATION frames, or frames holding only an HPACK
// table-size update, add nothing and are read for ever, each a frame's
// work for the server. A legitimate client sends a header block of at most
// 64 KiB (MaxHeaderBytes) in frames of up to 16 KiB: a few CONTINUATION
// frames, none empty.
const (
	// maxEmptyContinuations is the most CONTINUATION frames without
	// payload in a row; one more closes the connection.
	maxEmptyContinuations = 16
	// maxContinuations is the most CONTINUATION frames in a row, whatever
	// they hold; one more closes the connection.
	maxContinuations = 512
)

// HTTP/2 frame header fields (RFC 9113 section 4.1).
const (
	h2FrameHeaderLen   = 9
	h2PrefaceLen       = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	h2TypeRSTStream    = 0x3
	h2TypeContinuation = 0x9
)

// h2Frames follows the frame headers of an HTTP/2 connection's bytes as
// the server reads them, from the connection's first byte (the preface
// is skipped), to count runs of CONTINUATION frames and the streams the
// client resets (RST_STREAM frames, counted against its
// server.max_client_resets_per_second by the reading connection). It copies at most
// the 9 bytes of a frame header and skips payloads: a few operations a
// frame. Only the connection's serving goroutine (its reads) touches it.
type h2Frames struct {
	skip   int                    // bytes still to skip: the preface, then each frame's payload
	hdr    [h2FrameHeaderLen]byte // a frame header split between reads
	hdrN   int
	empty  int // CONTINUATION frames without payload in the current run
	conts  int // CONTINUATION frames in the current run
	resets int // RST_STREAM frames, not yet counted against the client
	began  bool
}

// scan follows b, the next bytes read, and reports false once a run of
// CONTINUATION frames passes maxEmptyContinuations empty ones or
// maxContinuations in all.
func (f *h2Frames) scan(b []byte) bool {
	if !f.began {
		f.began, f.skip = true, h2PrefaceLen
	}
	for len(b) > 0 {
		if f.skip > 0 {
			n := min(f.skip, len(b))
			f.skip -= n
			b = b[n:]
			continue
		}
		var h []byte
		if f.hdrN == 0 && len(b) >= h2FrameHeaderLen {
			h, b = b[:h2FrameHeaderLen], b[h2FrameHeaderLen:]
		} else {
			n := copy(f.hdr[f.hdrN:], b)
			f.hdrN += n
			b = b[n:]
			if f.hdrN < h2FrameHeaderLen {
				return true
			}
			h, f.hdrN = f.hdr[:], 0
		}
		length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		f.skip = length
		if h[3] != h2TypeContinuation {
			f.empty, f.conts = 0, 0
			if h[3] == h2TypeRSTStream {
				f.resets++
			}
			continue
		}
		f.conts++
		if length == 0 {
			f.empty++
		}
		if f.empty > maxEmptyContinuations || f.conts > maxContinuations {
			return false
		}
	}
	return true
}

// errContinuationFlood ends a connection that sent a run of CONTINUATION
// frames past maxEmptyContinuations empty ones or maxContinuations.
var errContinuationFlood = errors.New("http2: a run of CONTINUATION frames adding no header bytes")

// refuseContinuations closes c, whose client sent a run of CONTINUATION
// frames that adds nothing, and returns the read error the server ends it
// on.
func (c *trackedConn) refuseContinuations() error {
	c.l.emptyContinuations.Add(1)
	c.l.log.Warn("HTTP/2 connection closed: a run of CONTINUATION frames adding no header bytes",
		"client", ClientOf(c.RemoteAddr().String()), "max_empty", maxEmptyContinuations, "max_frames", maxContinuations)
	c.Close()
	return &net.OpError{Op: "read", Net: "tcp", Err: errContinuationFlood}
}

// refuseResets closes shed, the connections of c's client, which resets
// streams faster than server.max_client_resets_per_second (c among
// them), and returns the read error the server ends c on.
func (c *trackedConn) refuseResets(shed []*trackedConn) error {
	c.l.clients.countRefused(refusedResets)
	c.l.log.Warn("client's connections closed: it resets HTTP/2 streams faster than server.max_client_resets_per_second",
		"reason", refusedResets, "client", c.client.id, "setting", "server.max_client_resets_per_second",
		"limit", c.l.clients.resetRate.Load(), "connections", len(shed))
	c.l.drop(shed)
	return &net.OpError{Op: "read", Net: "tcp", Err: errResetFlood}
}

// errResetFlood ends a connection whose client resets streams faster
// than server.max_client_resets_per_second.
var errResetFlood = errors.New("http2: the client resets streams too fast")
