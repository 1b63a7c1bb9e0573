package admin

import (
	"testing"
	"time"
)

// TestSessionsEnd: a session ends after 30 minutes without a request, 8
// hours after its login whatever its use, and at its logout.
func TestSessionsEnd(t *testing.T) {
	start := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		uses  []time.Duration // requests after the login, in order
		check time.Duration   // the request asked about
		want  bool
	}{
		{name: "used at once", check: 0, want: true},
		{name: "idle 29 minutes", check: 29 * time.Minute, want: true},
		{name: "idle 30 minutes", check: 30 * time.Minute, want: false},
		{name: "used every 20 minutes for 7h40m", uses: every(20*time.Minute, 7*time.Hour+40*time.Minute), check: 7*time.Hour + 59*time.Minute, want: true},
		{name: "used every 20 minutes for 8 hours", uses: every(20*time.Minute, 7*time.Hour+40*time.Minute), check: 8 * time.Hour, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSessions()
			now := start
			s.now = func() time.Time { return now }
			id, se := s.create("alice")
			for _, u := range tc.uses {
				now = start.Add(u)
				if s.get(id) != se {
					t.Fatalf("session ended at %v, before the request asked about", u)
				}
			}
			now = start.Add(tc.check)
			if got := s.get(id) == se; got != tc.want {
				t.Errorf("session alive at %v = %v, want %v", tc.check, got, tc.want)
			}
			if !tc.want && s.len() != 0 {
				t.Errorf("%d sessions kept after the session ended, want 0", s.len())
			}
		})
	}
	s := newSessions()
	id, _ := s.create("bob")
	s.end(id)
	if s.get(id) != nil || s.len() != 0 {
		t.Errorf("a session ended by its logout is still there")
	}
	if s.get("") != nil || s.get("not-an-id") != nil {
		t.Errorf("an unknown ID found a session")
	}
}

// every returns step, 2 step, … up to end.
func every(step, end time.Duration) []time.Duration {
	var out []time.Duration
	for d := step; d <= end; d += step {
		out = append(out, d)
	}
	return out
}

// TestSessionsAreBounded: at most 1,000 sessions are kept; a login beyond
// that ends the oldest login, however recently it was used.
func TestSessionsAreBounded(t *testing.T) {
	s := newSessions()
	now := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	ids := make([]string, 0, maxSessions+2)
	for range maxSessions {
		id, _ := s.create("op")
		ids = append(ids, id)
		now = now.Add(time.Millisecond)
	}
	if s.get(ids[0]) == nil {
		t.Fatal("the oldest of 1,000 sessions ended")
	}
	for range 2 {
		id, _ := s.create("op")
		ids = append(ids, id)
	}
	if got := s.len(); got != maxSessions {
		t.Errorf("%d sessions kept, want %d", got, maxSessions)
	}
	for i, id := range ids {
		if alive, want := s.get(id) != nil, i >= 2; alive != want {
			t.Errorf("session %d alive = %v, want %v", i, alive, want)
		}
	}
}

// TestSessionIDs: a session's ID and CSRF token are 32 random bytes, and
// differ between sessions.
func TestSessionIDs(t *testing.T) {
	s := newSessions()
	seen := map[string]bool{}
	for range 100 {
		id, se := s.create("op")
		for _, v := range []string{id, se.csrf} {
			if len(v) != 64 || seen[v] {
				t.Fatalf("ID or CSRF token %q: want 64 hex digits, never twice", v)
			}
			seen[v] = true
		}
	}
}
