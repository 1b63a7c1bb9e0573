package proxy

import "net/http"

// Hold makes the routes named in held (route name → why, in words)
// answer every request 503 keyspace-held, until a later Hold leaves them
// out; nil or empty holds none. The program holds a route whose keys
// would be made anew in a keyspace with live keys (internal/keyspace): a
// route renamed away from its keyspace, or whose key recipe changed. A
// route in observe mode, which forwards every request anyway, is served.
func (p *Proxy) Hold(held map[string]string) {
	if len(held) == 0 {
		p.held.Store(nil)
		return
	}
	p.held.Store(&held)
}

// heldWhy returns why the route named name is held; false when it is not.
func (p *Proxy) heldWhy(name string) (string, bool) {
	m := p.held.Load()
	if m == nil {
		return "", false
	}
	why, ok := (*m)[name]
	return why, ok
}

// refuseHeld answers a request of a held route (Hold) and reports whether
// it did.
func (a *attempt) refuseHeld(w http.ResponseWriter) bool {
	why, held := a.p.heldWhy(a.rt.cfg.Name)
	if !held || a.observing() {
		return false
	}
	a.problem(w, OutcomeStoreError, probKeyspaceHeld, "the route's keys would be made anew while the store holds live keys "+
		"it made before: "+why+"; nothing was forwarded; an operator must keep the old keyspace or drop it", 30,
		map[string]any{"route": a.rt.cfg.Name, "keyspace": a.rt.cfg.Keyspace})
	return true
}
