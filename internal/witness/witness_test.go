package witness

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
)

// judge asks w about key and returns the verdict.
func judge(t *testing.T, w *Witness, key string) Verdict {
	t.Helper()
	v, err := w.Judge(context.Background(), key, "lost "+key)
	if err != nil {
		t.Fatalf("Judge(%s): %v", key, err)
	}
	return v
}

// TestJudge: a key answered within the window is Lost when found free,
// unless released on purpose (then forgotten: Fresh next time); a key
// never answered, or answered with a TTL that has passed, is Fresh.
func TestJudge(t *testing.T) {
	var lost []string
	released := map[string]bool{"r/-/released": true}
	w := New(Options{Window: time.Minute, MaxKeys: 1024,
		Released: func(_ context.Context, k string) (bool, error) { return released[k], nil },
		Lost:     func(reason string) { lost = append(lost, reason) }})
	now := time.Now()
	w.Answered("r/-/answered", time.Hour, now)
	w.Answered("r/-/released", time.Hour, now)
	w.Answered("r/-/short", 2*time.Second, now) // its TTL, less the margin, has passed
	w.Answered("r/-/long-ago", time.Hour, now.Add(-2*time.Minute))
	for _, tc := range []struct {
		key  string
		want Verdict
	}{
		{"r/-/never", Fresh},
		{"r/-/answered", Lost},
		{"r/-/released", Released},
		{"r/-/released", Fresh}, // forgotten once its release was seen
		{"r/-/short", Fresh},
		{"r/-/long-ago", Fresh},
	} {
		if got := judge(t, w, tc.key); got != tc.want {
			t.Errorf("Judge(%s) = %v, want %v", tc.key, got, tc.want)
		}
	}
	if len(lost) != 1 || lost[0] != "lost r/-/answered" {
		t.Errorf("Lost told %q, want once for r/-/answered", lost)
	}
	if st := w.Stats(); st.Lost != 1 || st.Released != 1 || st.Unknown != 0 {
		t.Errorf("Stats = %+v, want 1 lost, 1 released", st)
	}
}

// TestJudgeUnknown: when the release marks cannot be read, the verdict is
// Unknown with the error, and nobody is told of a loss.
func TestJudgeUnknown(t *testing.T) {
	boom := errors.New("store down")
	told := false
	w := New(Options{Window: time.Minute, MaxKeys: 64,
		Released: func(context.Context, string) (bool, error) { return false, boom },
		Lost:     func(string) { told = true }})
	w.Answered("k", time.Hour, time.Now())
	if v, err := w.Judge(context.Background(), "k", ""); v != Unknown || !errors.Is(err, boom) || told {
		t.Errorf("Judge = %v, %v (told %v); want Unknown, the error, nobody told", v, err, told)
	}
}

// TestFullTableForgetsEarly: a table far too small for the keys answered
// forgets the oldest, never wrongly remembers: every key it still holds
// was answered, and it counts the keys it gave up.
func TestFullTableForgetsEarly(t *testing.T) {
	w := New(Options{Window: time.Minute, MaxKeys: 64})
	if w.Capacity() != 64 {
		t.Fatalf("Capacity = %d, want 64", w.Capacity())
	}
	now := time.Now()
	for i := range 1000 {
		w.Answered("k"+strconv.Itoa(i), time.Hour, now.Add(time.Duration(i)*time.Millisecond))
	}
	held := 0
	for i := range 1000 {
		if w.seen("k"+strconv.Itoa(i), w.now()) {
			held++
		}
	}
	if held == 0 || held > 64 {
		t.Errorf("%d keys held, want 1 to 64", held)
	}
	if f := w.Stats().Forgotten; f != uint64(1000-held) {
		t.Errorf("Forgotten = %d, want %d", f, 1000-held)
	}
	for i := range 1000 {
		if w.seen("other"+strconv.Itoa(i), w.now()) {
			t.Fatalf("a key never answered is seen")
		}
	}
}

// TestNormalPathAllocatesNothing: remembering an answer and judging a
// fresh reservation allocate nothing.
func TestNormalPathAllocatesNothing(t *testing.T) {
	w := New(Options{Window: time.Minute, MaxKeys: 1 << 16})
	key := "charges/-/ORD-1234567890"
	ctx := context.Background()
	now := time.Now()
	if n := testing.AllocsPerRun(1000, func() {
		w.Answered(key, time.Hour, now)
		w.Judge(ctx, "charges/-/ORD-fresh", "")
	}); n != 0 {
		t.Errorf("%v allocations a request, want 0", n)
	}
}

func BenchmarkAnsweredAndJudge(b *testing.B) {
	w := New(Options{Window: 5 * time.Minute, MaxKeys: 1 << 18})
	keys, fresh := make([]string, 4096), make([]string, 4096)
	for i := range keys {
		keys[i], fresh[i] = "charges/-/ORD-"+strconv.Itoa(i), "charges/-/NEW-"+strconv.Itoa(i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			w.Judge(ctx, fresh[i%len(fresh)], "")
			w.Answered(keys[i%len(keys)], time.Hour, time.Now())
			i++
		}
	})
}

// TestEpochChangeForgets: answers remembered under one epoch are
// forgotten when the replica trusts another (an operator accepted a loss):
// a retry of one is then Fresh, and nobody is told of a loss.
func TestEpochChangeForgets(t *testing.T) {
	epoch := "e1"
	told := 0
	w := New(Options{Window: time.Minute, MaxKeys: 64, Epoch: func() string { return epoch }, Lost: func(string) { told++ }})
	if w.Sync("e1") {
		t.Fatal("the first Sync forgot")
	}
	w.Answered("a", time.Hour, time.Now())
	w.Answered("b", time.Hour, time.Now())
	if got := judge(t, w, "a"); got != Lost {
		t.Fatalf("Judge(a) in the same epoch = %v, want Lost", got)
	}
	epoch = "e2" // accepted
	if got := judge(t, w, "b"); got != Fresh || told != 1 {
		t.Errorf("Judge(b) after the epoch changed = %v (told %d), want Fresh, told once in all", got, told)
	}
	w.Answered("c", time.Hour, time.Now())
	if !w.Sync("e3") || w.Seen("c") {
		t.Errorf("Sync of a new epoch kept the answers")
	}
}

// TestLossKeepsAnswers: a retry whose reservation succeeded just before
// another detector (a canary, another retry) marked the store lost, so
// that the replica trusts no epoch when it is judged, is still Lost:
// refused, never forwarded. The answers are forgotten only once a new
// epoch is trusted (an operator accepted the loss).
func TestLossKeepsAnswers(t *testing.T) {
	epoch := "e1"
	w := New(Options{Window: time.Minute, MaxKeys: 64, Epoch: func() string { return epoch }})
	w.Sync(epoch)
	w.Answered("a", time.Hour, time.Now())
	w.Answered("b", time.Hour, time.Now())
	epoch = "" // marked lost meanwhile (the watcher's OnTrust says so too)
	w.Sync(epoch)
	if got := judge(t, w, "a"); got != Lost {
		t.Errorf("Judge(a) once the store was marked lost = %v, want Lost", got)
	}
	epoch = "e2" // accepted
	if got := judge(t, w, "b"); got != Fresh {
		t.Errorf("Judge(b) after the loss was accepted = %v, want Fresh", got)
	}
}

// TestClockSteps: a step of this host's clock never makes a key that the
// store expired by its TTL look answered within the window (a false
// alarm: the store marked lost, every protected route down). The wall
// clock stepped back (NTP after a pause) is outrun by the monotonic one,
// and a host suspended (a VM paused or migrated: the monotonic clock
// stopped) is told by the wall clock.
func TestClockSteps(t *testing.T) {
	for _, tc := range []struct {
		name string
		step time.Duration // of the wall clock, after the answers
		key  string
		want Verdict
	}{
		{"wall clock stepped back", -30 * time.Second, "short-ttl", Fresh},
		{"host suspended", 10 * time.Minute, "long-ttl", Fresh},
		{"wall clock stepped back, within the window", -30 * time.Second, "long-ttl", Lost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := New(Options{Window: 5 * time.Minute, MaxKeys: 64})
			// Answered now: one with a TTL of 2.5 s (remembered 0.5 s,
			// less the margin), one with a TTL longer than the window.
			w.Answered("short-ttl", 2500*time.Millisecond, time.Now())
			w.Answered("long-ttl", time.Hour, time.Now())
			time.Sleep(time.Second) // short-ttl expired in the store
			w.wall = func() int64 { return time.Now().Add(tc.step).UnixNano() }
			if got := judge(t, w, tc.key); got != tc.want {
				t.Errorf("Judge(%s) after the wall clock moved %v = %v, want %v", tc.key, tc.step, got, tc.want)
			}
		})
	}
}
