package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
)

// monitor records the commands Redis runs (MONITOR) on a connection of its
// own until stop is called.
type monitor struct {
	conn net.Conn
	done chan [][]string
}

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}
	m := &monitor{conn: conn, done: make(chan [][]string, 1)}
	go func() {
		var cmds [][]string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				m.done <- cmds
				return
			}
			// 1701634567.123456 [0 lua] "HSET" "k" ...
			_, rest, ok := strings.Cut(strings.TrimSuffix(line, "\r\n"), "] ")
			if !ok {
				continue
			}
			args, err := unrepr(rest)
			if err != nil {
				t.Errorf("MONITOR line %q: %v", line, err)
				continue
			}
			if len(args) == 2 && strings.EqualFold(args[0], "echo") && args[1] == "monitor-end" {
				m.done <- cmds
				return
			}
			if strings.Contains(line, " lua] ") {
				cmds = append(cmds, args)
			}
		}
	}()
	return m
}

// stop returns the commands that scripts ran (MONITOR's "lua" lines)
// before it was called: it sends an ECHO through raw and reads up to it.
func (m *monitor) stop(t *testing.T, raw goredis.UniversalClient) [][]string {
	t.Helper()
	if err := raw.Echo(context.Background(), "monitor-end").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case cmds := <-m.done:
		return cmds
	case <-time.After(30 * time.Second):
		t.Fatal("MONITOR did not show the ECHO within 30s")
		return nil
	}
}

// unrepr splits MONITOR's quoted arguments ("a" "b\"c" "\x00").
func unrepr(s string) ([]string, error) {
	var args []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] != '"' {
			return nil, fmt.Errorf("argument does not start with a quote: %q", s)
		}
		var b strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] != '\\' {
				b.WriteByte(s[i])
				continue
			}
			if i++; i >= len(s) {
				return nil, errors.New("escape at the end")
			}
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+2 >= len(s) {
					return nil, errors.New("short \\x escape")
				}
				n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					return nil, err
				}
				b.WriteByte(byte(n))
				i += 2
			default:
				b.WriteByte(s[i])
			}
		}
		if i >= len(s) {
			return nil, errors.New("unterminated argument")
		}
		args = append(args, b.String())
		s = s[i+1:]
	}
	return args, nil
}

// readCommands are the commands the scripts run that change nothing.
var readCommands = map[string]bool{"time": true, "exists": true, "get": true, "hget": true, "hmget": true, "pttl": true}

// fixtureCommands reads the commands of testdata files, grouped by the key
// they write (their second word), with {p} replaced by prefix and the
// times left as {now...} placeholders.
func fixtureCommands(t *testing.T, prefix string, names ...string) map[string][][]string {
	t.Helper()
	byKey := map[string][][]string{}
	for _, name := range names {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			args := strings.Fields(strings.ReplaceAll(line, "{p}", prefix))
			byKey[args[1]] = append(byKey[args[1]], args)
		}
	}
	return byKey
}

var nowPlaceholder = regexp.MustCompile(`^\{now([+-]\d+)?\}$`)

// matchCommands reports how got (the writes a script ran, for one key)
// differs from want (a fixture's, with {now±N} placeholders): each
// placeholder matches an integer time of the test (from now, Unix ms, to
// a lease after it), and every one of a key stands for the same time: the
// differences between a record's times are the fixture's.
func matchCommands(got, want [][]string, now int64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d write commands, want %d", len(got), len(want))
	}
	base := int64(-1)
	for i := range want {
		if len(got[i]) != len(want[i]) {
			return fmt.Errorf("command %d has %d words, want %d", i+1, len(got[i]), len(want[i]))
		}
		for j, w := range want[i] {
			g := got[i][j]
			m := nowPlaceholder.FindStringSubmatch(w)
			if m == nil {
				if j == 0 {
					g, w = strings.ToUpper(g), strings.ToUpper(w)
				}
				if g != w {
					return fmt.Errorf("command %d word %d is %q, want %q", i+1, j+1, g, w)
				}
				continue
			}
			off, _ := strconv.ParseInt(m[1], 10, 64)
			n, err := strconv.ParseInt(g, 10, 64)
			if err != nil {
				return fmt.Errorf("command %d word %d is %q, want an integer time (%s)", i+1, j+1, g, w)
			}
			if n < now-10_000 || n > now+70_000 {
				return fmt.Errorf("command %d word %d is %d, not a time of this test (%d)", i+1, j+1, n, now)
			}
			switch b := n - off; {
			case base < 0:
				base = b
			case b != base:
				return fmt.Errorf("command %d word %d is %d: %s puts now at %d, an earlier word at %d", i+1, j+1, n, w, b, base)
			}
		}
	}
	return nil
}

// TestHashLayoutWritesAsEarlierReleases: with layoutHash, a reservation, a
// commit, an in-doubt mark and a release send Redis exactly the write
// commands the release before the packed layout sent (as MONITOR shows
// them: testdata/hash-records.txt and testdata/hash-changes.txt hold that
// release's), and leave the same records: so replicas of that release,
// sharing the Redis in a rolling upgrade, read everything written.
func TestHashLayoutWritesAsEarlierReleases(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, RecordLayout: layoutHash})
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	rt, err := raw.Time(c).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := fixtureCommands(t, s.prefix, "hash-records.txt", "hash-changes.txt")
	done := `{"status":201,"header":{"Content-Type":["application/json"]},"body":"eyJjaGFyZ2VJZCI6ImNoXzEifQ==","body_stored":true}`
	resp, err := decodeResponse([]byte(done))
	if err != nil {
		t.Fatal(err)
	}
	reserve := func(key, tok, fp string) {
		t.Helper()
		if rec, err := s.Reserve(c, key, store.Reservation{Token: tok, Fingerprint: fp, Lease: time.Minute, TTL: 24 * time.Hour}); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %+v, %v; want reserved", key, rec, err)
		}
	}

	mon := startMonitor(t, srv.Addr())
	// The fixture's records, one after the other, as that release's
	// replicas made them (ORD-LAPSED is an in-flight reservation whose
	// owner died: written as ORD-INFLIGHT, some time earlier).
	reserve("charges/-/ORD-INFLIGHT", "tok-inflight", "fp-inflight")
	reserve("charges/-/ORD-DONE", "tok-done", "fp-done")
	if err := s.Commit(c, "charges/-/ORD-DONE", "tok-done", resp, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	reserve("charges/-/ORD-LAPSED", "tok-lapsed", "fp-lapsed")
	reserve("charges/-/ORD-MARK", "tok-mark", "fp-mark")
	if err := s.MarkInDoubt(c, "charges/-/ORD-MARK", "tok-mark", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	// The state between the mark and the release, as the fixture leaves
	// it before its DEL.
	markType, markFields := raw.Type(c, s.prefix+"charges/-/ORD-MARK").Val(), raw.HGetAll(c, s.prefix+"charges/-/ORD-MARK").Val()
	if err := s.Release(c, "charges/-/ORD-MARK", "tok-mark"); err != nil {
		t.Fatal(err)
	}
	cmds := mon.stop(t, raw)

	got := map[string][][]string{}
	for _, cmd := range cmds {
		if !readCommands[strings.ToLower(cmd[0])] {
			got[cmd[1]] = append(got[cmd[1]], cmd)
		}
	}
	for key, w := range want {
		if err := matchCommands(got[key], w, rt.UnixMilli()); err != nil {
			t.Errorf("%s: %v\n got %q\nwant %q", key, err, got[key], w)
		}
	}
	for key := range got {
		if want[key] == nil {
			t.Errorf("a script wrote %s: %q; the fixture has no such key", key, got[key])
		}
	}

	// The records the hash layout left are those the fixture leaves: the
	// same type, fields and values (times aside, which match above) and
	// TTLs.
	old := fmt.Sprintf("old%d:", prefixes.Add(1))
	loadFixture(t, raw, "hash-records.txt", old)
	mark := old + "charges/-/ORD-MARK"
	fix := fixtureCommands(t, old, "hash-changes.txt")[mark]
	for _, cmd := range fix[:len(fix)-1] { // all but its DEL
		if err := raw.Do(c, toAny(cmd)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	times := map[string]bool{"cr": true, "le": true}
	compare := func(key, gotType, wantType string, gotF, wantF map[string]string) {
		t.Helper()
		if gotType != wantType {
			t.Errorf("%s is a %s, the earlier release leaves a %s", key, gotType, wantType)
		}
		for f := range times {
			_, g := gotF[f]
			_, w := wantF[f]
			if g != w {
				t.Errorf("%s: field %s present %v, the earlier release leaves it %v", key, f, g, w)
			}
			delete(gotF, f)
			delete(wantF, f)
		}
		if !reflect.DeepEqual(gotF, wantF) {
			t.Errorf("%s: fields %v, the earlier release leaves %v", key, gotF, wantF)
		}
	}
	for _, k := range []string{"charges/-/ORD-INFLIGHT", "charges/-/ORD-DONE", "charges/-/ORD-LAPSED"} {
		compare(k, raw.Type(c, s.prefix+k).Val(), raw.Type(c, old+k).Val(), raw.HGetAll(c, s.prefix+k).Val(), raw.HGetAll(c, old+k).Val())
		g, w := raw.PTTL(c, s.prefix+k).Val(), raw.PTTL(c, old+k).Val()
		if d := g - w; d < -time.Minute || d > time.Minute {
			t.Errorf("%s: PTTL %v, the earlier release leaves %v", k, g, w)
		}
	}
	compare("charges/-/ORD-MARK (marked)", markType, raw.Type(c, mark).Val(), markFields, raw.HGetAll(c, mark).Val())
}

func toAny(words []string) []any {
	a := make([]any, len(words))
	for i, w := range words {
		a[i] = w
	}
	return a
}

// previousGet reads key as a replica of the release before the packed
// layout does (its getScript, testdata/previous-release-get.lua) and
// decodes the reply as that release did.
func previousGet(t *testing.T, raw goredis.UniversalClient, key string) (*store.Record, error) {
	t.Helper()
	src, err := os.ReadFile("testdata/previous-release-get.lua")
	if err != nil {
		t.Fatal(err)
	}
	v, err := raw.Eval(context.Background(), string(src), []string{key}).Slice()
	if err != nil {
		return nil, err
	}
	if len(v) != 1 && len(v) != 9 {
		return nil, fmt.Errorf("%d elements in the reply, that release wants 1 or 9", len(v))
	}
	if len(v) == 9 {
		v = slices.Insert(v, 7, any(nil)) // that release read no origin (og)
	}
	return decodeRecord(v)
}

// TestMixedLayouts: replicas with layoutPacked and layoutHash share one
// Redis (the second step of the upgrade, or a rollback's first): each reads,
// reserves against, commits, marks and releases what the other wrote,
// fenced by the owner token. A layoutHash replica leaves a hash whatever
// it changes, which the release before the packed layout reads; what a
// layoutPacked replica wrote stays unreadable to that release.
func TestMixedLayouts(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	prefix := fmt.Sprintf("mixed%d:", prefixes.Add(1))
	stores := map[RecordLayout]*Store{
		layoutPacked: newStore(t, Options{Addrs: []string{srv.Addr()}, KeyPrefix: prefix, RecordLayout: layoutPacked}),
		layoutHash:   newStore(t, Options{Addrs: []string{srv.Addr()}, KeyPrefix: prefix, RecordLayout: layoutHash}),
	}
	typeOf := map[RecordLayout]string{layoutPacked: "string", layoutHash: "hash"}
	other := map[RecordLayout]RecordLayout{layoutPacked: layoutHash, layoutHash: layoutPacked}
	answer := store.Response{Status: 201, Body: []byte(`{"id":1}`), BodyStored: true}

	for _, writer := range []RecordLayout{layoutPacked, layoutHash} {
		for _, op := range []string{"commit", "mark", "release"} {
			changer := other[writer]
			t.Run(fmt.Sprintf("%s writes, %s %ss", writer, changer, op), func(t *testing.T) {
				w, ch := stores[writer], stores[changer]
				key := fmt.Sprintf("r/-/%s-%s", writer, op)
				full := prefix + key
				if rec, err := w.Reserve(c, key, res); err != nil || rec != nil {
					t.Fatalf("Reserve = %+v, %v; want reserved", rec, err)
				}
				if typ := raw.Type(c, full).Val(); typ != typeOf[writer] {
					t.Errorf("a %s reservation is a %s, want a %s", writer, typ, typeOf[writer])
				}
				// The previous release reads what a hash replica writes,
				// and fails on (never misreads) a packed record.
				prev, err := previousGet(t, raw, full)
				switch writer {
				case layoutHash:
					if err != nil || prev == nil || prev.State != store.StateInFlight || prev.Token != res.Token {
						t.Errorf("the previous release reads %+v, %v; want in flight under %s", prev, err, res.Token)
					}
				case layoutPacked:
					if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
						t.Errorf("the previous release reads a packed record as %+v, %v; want WRONGTYPE", prev, err)
					}
				}

				// The other layout reads it and is fenced by it.
				if rec, err := ch.Get(c, key); err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != res.Token || rec.Fingerprint != res.Fingerprint {
					t.Fatalf("%s Get = %+v, %v; want in flight under %s", changer, rec, err, res.Token)
				}
				intruder := res
				intruder.Token = "tok-intruder"
				if rec, err := ch.Reserve(c, key, intruder); err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != res.Token {
					t.Fatalf("%s Reserve by another token = %+v, %v; want the record in flight", changer, rec, err)
				}
				if rec, err := ch.Reserve(c, key, res); err != nil || rec != nil {
					t.Errorf("%s Reserve by the owner's token (a retry) = %+v, %v; want reserved", changer, rec, err)
				}
				var wantState store.State
				var opErr, intruderErr error
				switch op {
				case "commit":
					intruderErr = ch.Commit(c, key, intruder.Token, store.Response{Status: 500}, time.Hour)
					opErr, wantState = ch.Commit(c, key, res.Token, answer, 2*time.Hour), store.StateCompleted
				case "mark":
					intruderErr = ch.MarkInDoubt(c, key, intruder.Token, time.Hour)
					opErr, wantState = ch.MarkInDoubt(c, key, res.Token, 2*time.Hour), store.StateInDoubt
				case "release":
					intruderErr = ch.Release(c, key, intruder.Token)
					opErr = ch.Release(c, key, res.Token)
				}
				if !errors.Is(intruderErr, store.ErrNotOwner) {
					t.Errorf("%s %s by another token: %v, want ErrNotOwner", changer, op, intruderErr)
				}
				if opErr != nil {
					t.Fatalf("%s %s by the owner: %v", changer, op, opErr)
				}

				// Both layouts read the result alike.
				for _, l := range []RecordLayout{layoutPacked, layoutHash} {
					rec, err := stores[l].Get(c, key)
					if err != nil {
						t.Fatalf("%s Get after the %s: %v", l, op, err)
					}
					if op == "release" {
						if rec != nil {
							t.Errorf("%s Get after the release = %+v, want none", l, rec)
						}
						continue
					}
					if rec == nil || rec.State != wantState || rec.Token != res.Token {
						t.Fatalf("%s Get after the %s = %+v, want %s under %s", l, op, rec, wantState, res.Token)
					}
					if op == "commit" && (rec.Response == nil || rec.Response.Status != 201 || string(rec.Response.Body) != `{"id":1}`) {
						t.Errorf("%s Get after the commit: response %+v, want the answer", l, rec.Response)
					}
					if until := time.Until(rec.ExpiresAt); until < 2*time.Hour-time.Minute || until > 2*time.Hour+time.Minute {
						t.Errorf("%s Get after the %s expires in %v, want about 2h", l, op, until)
					}
				}
				if op == "release" {
					return
				}
				// A hash replica leaves a hash whatever it changed (the
				// previous release reads it); a packed replica changes a
				// hash as a hash, and a packed record stays packed.
				wantType := typeOf[writer]
				if changer == layoutHash {
					wantType = "hash"
				}
				if typ := raw.Type(c, full).Val(); typ != wantType {
					t.Errorf("after the %s the record is a %s, want a %s", op, typ, wantType)
				}
				if wantType == "hash" {
					prev, err := previousGet(t, raw, full)
					if err != nil || prev == nil || prev.State != wantState || prev.Token != res.Token {
						t.Errorf("the previous release reads %+v, %v after the %s; want %s", prev, err, op, wantState)
					}
					if op == "commit" && (prev == nil || prev.Response == nil || prev.Response.Status != 201) {
						t.Errorf("the previous release reads no answer after the commit: %+v", prev)
					}
					if f := raw.HGetAll(c, full).Val(); f["le"] != "" {
						t.Errorf("the %s hash keeps a lease %q; the previous release deletes it", wantState, f["le"])
					}
				}
				// A known answer is never downgraded, in either layout.
				if op == "commit" {
					if err := w.MarkInDoubt(c, key, res.Token, time.Hour); err != nil {
						t.Fatal(err)
					}
					if err := w.Commit(c, key, res.Token, store.Response{Status: 500}, time.Hour); err != nil {
						t.Fatal(err)
					}
					if rec, err := ch.Get(c, key); err != nil || rec == nil || rec.State != store.StateCompleted || rec.Response.Status != 201 {
						t.Errorf("after a mark and a second commit: %+v, %v; want the first answer", rec, err)
					}
				}
			})
		}
	}
}
