package admission

import "testing"

// TestBudgetTakeFor: request bodies take the whole budget and their
// client's share; a client holding nothing but the growing body may always
// grow it; answers take the whole budget only.
func TestBudgetTakeFor(t *testing.T) {
	type step struct {
		op     string // "body": TakeFor; "answer": Take; "release"; "give"
		client string
		own, n int64
		want   string // TakeFor's answer; for Take, "" or RefusalAnswer
	}
	tests := []struct {
		name         string
		limit, share int64
		steps        []step
		wantUsed     int64
		wantHeld     map[string]int64
		wantRefusals map[string]int
	}{
		{"within the share", 100, 40, []step{
			{"body", "a", 0, 20, ""},
			{"body", "a", 0, 20, ""},
		}, 40, map[string]int64{"a": 40}, nil},
		{"over the share: refused, the whole budget untouched", 100, 40, []step{
			{"body", "a", 0, 30, ""},
			{"body", "a", 0, 20, RefusalClient},
			{"body", "b", 0, 30, ""},
		}, 60, map[string]int64{"a": 30, "b": 30}, map[string]int{RefusalClient: 1}},
		{"one body grows past the share", 100, 40, []step{
			{"body", "a", 0, 30, ""},
			{"body", "a", 30, 30, ""},
			{"body", "a", 60, 30, ""},
		}, 90, map[string]int64{"a": 90}, nil},
		{"a second body of the client is held to the share", 100, 40, []step{
			{"body", "a", 0, 30, ""},
			{"body", "a", 30, 30, ""},
			{"body", "a", 0, 4, RefusalClient},
		}, 60, map[string]int64{"a": 60}, map[string]int{RefusalClient: 1}},
		{"the whole budget full: refused, the share untouched", 100, 80, []step{
			{"body", "a", 0, 70, ""},
			{"body", "b", 0, 40, RefusalBudget},
		}, 70, map[string]int64{"a": 70}, map[string]int{RefusalBudget: 1}},
		{"answers fill the budget, bodies are refused", 100, 50, []step{
			{"answer", "", 0, 90, ""},
			{"body", "a", 0, 20, RefusalBudget},
			{"answer", "", 0, 20, RefusalAnswer},
		}, 90, map[string]int64{}, map[string]int{RefusalBudget: 1, RefusalAnswer: 1}},
		{"released bytes are free again; an empty client leaves the map", 100, 40, []step{
			{"body", "a", 0, 40, ""},
			{"body", "a", 0, 4, RefusalClient},
			{"release", "a", 0, 40, ""},
			{"give", "", 0, 40, ""},
			{"body", "a", 0, 4, ""},
			{"release", "a", 0, 4, ""},
			{"give", "", 0, 4, ""},
		}, 0, map[string]int64{}, map[string]int{RefusalClient: 1}},
		{"no share configured", 100, 0, []step{
			{"body", "a", 0, 60, ""},
			{"body", "a", 0, 40, ""},
		}, 100, map[string]int64{"a": 100}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refusals := map[string]int{}
			b := &Budget{refused: func(r string) { refusals[r]++ }}
			b.limit.Store(tt.limit)
			b.perClient.Store(tt.share)
			for i, s := range tt.steps {
				var got string
				switch s.op {
				case "body":
					got = b.TakeFor(s.client, s.own, s.n)
				case "answer":
					if !b.Take(s.n, RefusalAnswer) {
						got = RefusalAnswer
					}
				case "release":
					b.Release(s.client, s.n)
				case "give":
					b.Give(s.n)
				}
				if got != s.want {
					t.Errorf("step %d (%s %s %d): got %q, want %q", i, s.op, s.client, s.n, got, s.want)
				}
			}
			if got := b.used.Load(); got != tt.wantUsed {
				t.Errorf("used = %d, want %d", got, tt.wantUsed)
			}
			if len(b.clients) != len(tt.wantHeld) {
				t.Errorf("clients = %v, want %v", b.clients, tt.wantHeld)
			}
			for c, want := range tt.wantHeld {
				if got := b.clientHeld(c); got != want {
					t.Errorf("client %s holds %d, want %d", c, got, want)
				}
			}
			for _, r := range bufferRefusalReasons {
				if refusals[r] != tt.wantRefusals[r] {
					t.Errorf("refusals[%s] = %d, want %d", r, refusals[r], tt.wantRefusals[r])
				}
			}
		})
	}
}

// TestClientOf: the share is keyed by IP address (HTTP/2 streams of one
// connection, and connections from one host, are one client), and by /64
// for IPv6, which one host commonly holds whole.
func TestClientOf(t *testing.T) {
	tests := []struct{ remote, want string }{
		{"127.0.0.1:5000", "127.0.0.1"},
		{"127.0.0.1:5001", "127.0.0.1"},
		{"127.0.0.2:5000", "127.0.0.2"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1"},
		{"[2001:db8:1:2:aaaa::1]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::9]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:443", "2001:db8:1:3::/64"},
		{"pipe", "pipe"},
	}
	for _, tt := range tests {
		if got := ClientOf(tt.remote); got != tt.want {
			t.Errorf("ClientOf(%q) = %q, want %q", tt.remote, got, tt.want)
		}
	}
}

// TestBudgetSaturated: saturated once less than the reserve is free.
func TestBudgetSaturated(t *testing.T) {
	tests := []struct {
		limit, used, reserve int64
		want                 bool
	}{
		{100, 0, 10, false},
		{100, 90, 10, false},
		{100, 91, 10, true},
		{0, 1000, 10, false}, // no limit
	}
	for _, tt := range tests {
		b := &Budget{}
		b.limit.Store(tt.limit)
		b.used.Store(tt.used)
		if got := b.Saturated(tt.reserve); got != tt.want {
			t.Errorf("limit %d used %d reserve %d: saturated = %v, want %v", tt.limit, tt.used, tt.reserve, got, tt.want)
		}
	}
}

// BenchmarkBudgetBody is what admission adds to a request with a small
// body: one charge to the budget and the client's share, and its return.
// Old, one atomic take and give, for comparison.
func BenchmarkBudgetBody(b *testing.B) {
	bud := &Budget{}
	bud.limit.Store(64 << 20)
	bud.perClient.Store(8 << 20)
	b.Run("take-for-client", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if bud.TakeFor("127.0.0.1", 0, 100) != "" {
					b.Fatal("refused")
				}
				bud.Give(100)
				bud.Release("127.0.0.1", 100)
			}
		})
	})
	b.Run("take-only", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !bud.reserve(100) {
					b.Fatal("refused")
				}
				bud.Give(100)
			}
		})
	})
	b.Run("client-of", func(b *testing.B) {
		for b.Loop() {
			ClientOf("127.0.0.1:54321")
		}
	})
}
