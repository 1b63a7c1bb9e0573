package admin

import (
	"container/list"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"
	"time"
)

// The limits of the console's sessions: a session ends after
// sessionIdle without a request, or sessionLifetime after its login,
// whichever comes first; at most maxSessions are kept, and a login beyond
// that ends the oldest.
const (
	sessionIdle     = 30 * time.Minute
	sessionLifetime = 8 * time.Hour
	maxSessions     = 1000
)

// session is a console login: who logged in, and the CSRF token every
// POST of the session carries.
type session struct {
	operator string
	csrf     string
	created  time.Time
	lastSeen time.Time
	// hash is the session's key in sessions.byHash; elem its place in
	// sessions.order.
	hash [sha256.Size]byte
	elem *list.Element

	// flashes are the outcomes of the session's acts, each shown once by
	// the page its POST redirects to (post/redirect/get: reloading that
	// page repeats nothing); the oldest go beyond maxFlashes.
	flashMu  sync.Mutex
	flashes  map[string]flash
	flashIDs []string
}

// maxFlashes is how many outcomes of acts not yet shown a session keeps.
const maxFlashes = 16

// flash is the outcome of an act, kept for the page that shows it: its
// status, div#result, and the page's own data (a bulk release's table).
type flash struct {
	status int
	result *resultView
	data   any
}

// putFlash keeps f and returns its ID, for the redirect's ?done=.
func (se *session) putFlash(f flash) string {
	id := randomHex(8)
	se.flashMu.Lock()
	defer se.flashMu.Unlock()
	if se.flashes == nil {
		se.flashes = map[string]flash{}
	}
	for len(se.flashIDs) >= maxFlashes {
		delete(se.flashes, se.flashIDs[0])
		se.flashIDs = se.flashIDs[1:]
	}
	se.flashes[id] = f
	se.flashIDs = append(se.flashIDs, id)
	return id
}

// takeFlash returns the outcome kept under id and forgets it: a page
// shows an act's outcome once.
func (se *session) takeFlash(id string) (flash, bool) {
	se.flashMu.Lock()
	defer se.flashMu.Unlock()
	f, ok := se.flashes[id]
	if ok {
		delete(se.flashes, id)
		se.flashIDs = slices.DeleteFunc(se.flashIDs, func(x string) bool { return x == id })
	}
	return f, ok
}

// sessions are the console's logins, in memory: a restart logs every
// operator out. They are kept by the hash of their ID, so that neither
// the map nor a timing of its lookups holds the ID itself.
type sessions struct {
	mu     sync.Mutex
	byHash map[[sha256.Size]byte]*session
	order  list.List // of *session, oldest login first
	now    func() time.Time
}

func newSessions() *sessions {
	return &sessions{byHash: map[[sha256.Size]byte]*session{}, now: time.Now}
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}

// create starts a session of operator and returns its ID, the cookie's
// value: 32 random bytes, never the token. The oldest sessions end while
// there are maxSessions.
func (s *sessions) create(operator string) (string, *session) {
	id := randomHex(32)
	now := s.now()
	se := &session{operator: operator, csrf: randomHex(32), created: now, lastSeen: now, hash: sha256.Sum256([]byte(id))}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.byHash) >= maxSessions {
		s.remove(s.order.Front().Value.(*session))
	}
	se.elem = s.order.PushBack(se)
	s.byHash[se.hash] = se
	return id, se
}

// get returns the live session of id and marks it used now; nil when
// there is none, or it ended (idle or too old: then it is forgotten).
func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	hash := sha256.Sum256([]byte(id))
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	// The oldest logins past their lifetime go first, so that ended
	// sessions do not wait for the bound to be forgotten.
	for f := s.order.Front(); f != nil && now.Sub(f.Value.(*session).created) >= sessionLifetime; f = s.order.Front() {
		s.remove(f.Value.(*session))
	}
	se := s.byHash[hash]
	if se == nil {
		return nil
	}
	if now.Sub(se.lastSeen) >= sessionIdle {
		s.remove(se)
		return nil
	}
	se.lastSeen = now
	return se
}

// end forgets the session of id (a logout).
func (s *sessions) end(id string) {
	hash := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.byHash[hash]; se != nil {
		s.remove(se)
	}
}

// len is how many sessions are kept.
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byHash)
}

// remove forgets se. s.mu is held.
func (s *sessions) remove(se *session) {
	s.order.Remove(se.elem)
	delete(s.byHash, se.hash)
}
