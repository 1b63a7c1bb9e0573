package admission

import (
	"errors"
	"net"
	"time"
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

// Bounds on PING frames (CVE-2019-9512's kind). Go's server answers
// each PING and bounds only the answers queued unread; a client that
// reads them may send PINGs as fast as it writes, each a frame read and
// one written by the server: from 119 addresses, probes waited 8 to 10 s.
// A client uses PINGs to keep an idle connection open or to measure the
// round trip, a few a second at most (gRPC's keepalive: one in 10 s or
// more; its bandwidth probe: one per burst of DATA the server sends).
const (
	// maxPingBurst is the most PINGs a connection may send at once;
	// maxPingsPerSecond the rate it may keep up. One past them closes
	// the connection.
	maxPingBurst      = 64
	maxPingsPerSecond = 10
)

// HTTP/2 frame header fields (RFC 9113 section 4.1).
const (
	h2FrameHeaderLen   = 9
	h2PrefaceLen       = len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	h2TypeRSTStream    = 0x3
	h2TypePing         = 0x6
	h2TypeContinuation = 0x9
	h2FlagAck          = 0x1
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
	pings  float64   // PINGs, drained at maxPingsPerSecond since pingAt
	pingAt time.Time // when pings was last drained
	// flood is why scan last reported false: errContinuationFlood or
	// errPingFlood.
	flood error
}

// scan follows b, the next bytes read, and reports false once a run of
// CONTINUATION frames passes maxEmptyContinuations empty ones or
// maxContinuations in all, or PINGs pass maxPingBurst at once or
// maxPingsPerSecond; flood then says which.
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
			switch {
			case h[3] == h2TypeRSTStream:
				f.resets++
			case h[3] == h2TypePing && h[4]&h2FlagAck == 0 && !f.ping(time.Now()):
				f.flood = errPingFlood
				return false
			}
			continue
		}
		f.conts++
		if length == 0 {
			f.empty++
		}
		if f.empty > maxEmptyContinuations || f.conts > maxContinuations {
			f.flood = errContinuationFlood
			return false
		}
	}
	return true
}

// ping counts a PING read at now and reports whether the connection is
// still within maxPingBurst and maxPingsPerSecond.
func (f *h2Frames) ping(now time.Time) bool {
	if !f.pingAt.IsZero() {
		f.pings = max(f.pings-now.Sub(f.pingAt).Seconds()*maxPingsPerSecond, 0)
	}
	f.pingAt = now
	f.pings++
	return f.pings <= maxPingBurst
}

// errPingFlood ends a connection that sent PINGs past maxPingBurst or
// maxPingsPerSecond.
var errPingFlood = errors.New("http2: PING frames faster than a client needs them")

// refuseFlood closes c, whose client sent a run of CONTINUATION frames
// that adds nothing or a flood of PINGs (c.frames.flood says which), and
// returns the read error the server ends it on.
func (c *trackedConn) refuseFlood() error {
	if c.frames.flood == errPingFlood {
		c.l.pingFloods.Add(1)
		c.l.log.Warn("HTTP/2 connection closed: PING frames faster than a client needs them",
			"client", ClientOf(c.RemoteAddr().String()), "max_burst", maxPingBurst, "max_per_second", maxPingsPerSecond)
		c.Close()
		return &net.OpError{Op: "read", Net: "tcp", Err: errPingFlood}
	}
	return c.refuseContinuations()
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
