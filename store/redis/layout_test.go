package redis

import (
	"bufio"
	"context"
	"errors"
	"net/http"
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

// loadFixture sends the commands of testdata/name to Redis through raw,
// with {p} replaced by prefix and {now}, {now+N}, {now-N} by Redis' time in
// Unix ms plus or minus N. It returns that time.
func loadFixture(t *testing.T, raw goredis.UniversalClient, name, prefix string) time.Time {
	t.Helper()
	c := context.Background()
	rt, err := raw.Time(c).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := rt.UnixMilli()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	times := regexp.MustCompile(`\{now([+-]\d+)?\}`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.ReplaceAll(line, "{p}", prefix)
		line = times.ReplaceAllStringFunc(line, func(m string) string {
			off, _ := strconv.ParseInt(strings.Trim(m[4:], "{}"), 10, 64)
			return strconv.FormatInt(now+off, 10)
		})
		var args []any
		for _, a := range strings.Fields(line) {
			args = append(args, a)
		}
		if err := raw.Do(c, args...).Err(); err != nil {
			t.Fatalf("fixture %s: %s: %v", name, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(now)
}

// TestHashRecordsOfEarlierReleases: records written by the release before
// the packed layout (hashes, testdata/hash-records.txt, the exact commands
// its scripts sent) are read, reserved against, committed, marked in
// doubt, released, listed and reconciled by the current code, with their
// fencing and TTLs.
func TestHashRecordsOfEarlierReleases(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	now := loadFixture(t, raw, "hash-records.txt", s.prefix)
	near := func(what string, got, want time.Time) {
		t.Helper()
		if d := got.Sub(want); d < -5*time.Second || d > 5*time.Second {
			t.Errorf("%s = %v, want about %v", what, got, want)
		}
	}

	// Read.
	rec, err := s.Get(c, "charges/-/ORD-INFLIGHT")
	if err != nil || rec == nil || rec.State != store.StateInFlight || rec.Token != "tok-inflight" || rec.Fingerprint != "fp-inflight" {
		t.Fatalf("Get(ORD-INFLIGHT) = %+v, %v; want in flight under tok-inflight", rec, err)
	}
	near("in-flight lease", rec.LeaseExpiresAt, now.Add(time.Minute))
	near("in-flight expiry", rec.ExpiresAt, now.Add(24*time.Hour))
	if !rec.CreatedAt.Equal(now) {
		t.Errorf("in-flight created = %v, want %v", rec.CreatedAt, now)
	}
	done, err := s.Get(c, "charges/-/ORD-DONE")
	wantResp := &store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"chargeId":"ch_1"}`), BodyStored: true}
	if err != nil || done == nil || done.State != store.StateCompleted || !reflect.DeepEqual(done.Response, wantResp) {
		t.Fatalf("Get(ORD-DONE) = %+v, %v; want completed with %+v", done, err, wantResp)
	}
	if rec, err := s.Get(c, "charges/-/ORD-LAPSED"); err != nil || rec == nil || rec.State != store.StateInDoubt {
		t.Errorf("Get(ORD-LAPSED) = %+v, %v; want in doubt (lease ran out)", rec, err)
	}

	// Reserve: the owner's retry is its own, another token gets the record.
	if rec, err := s.Reserve(c, "charges/-/ORD-INFLIGHT", store.Reservation{Token: "tok-inflight", Fingerprint: "fp-inflight", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Errorf("Reserve(ORD-INFLIGHT) by its owner = %+v, %v; want reserved (its own)", rec, err)
	}
	if rec, err := s.Reserve(c, "charges/-/ORD-DONE", store.Reservation{Token: "other", Fingerprint: "fp-done", Lease: time.Minute, TTL: time.Hour}); err != nil || rec == nil || rec.State != store.StateCompleted || !reflect.DeepEqual(rec.Response, wantResp) {
		t.Errorf("Reserve(ORD-DONE) = %+v, %v; want the completed record", rec, err)
	}

	// List sees all four, in their states.
	got := map[string]store.State{}
	for cursor := ""; ; {
		page, next, err := s.List(c, store.ListQuery{Prefix: "charges/", Limit: 10, Cursor: cursor})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, l := range page {
			got[l.Key] = l.State
			if l.Key == "charges/-/ORD-DONE" && l.StoredStatus != 201 {
				t.Errorf("listed ORD-DONE stored status %d, want 201", l.StoredStatus)
			}
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	want := map[string]store.State{"charges/-/ORD-INFLIGHT": store.StateInFlight, "charges/-/ORD-DONE": store.StateCompleted,
		"charges/-/ORD-LAPSED": store.StateInDoubt, "charges/-/ORD-MARK": store.StateInFlight}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}

	// Commit: fenced by the token, then completed with the new TTL.
	if err := s.Commit(c, "charges/-/ORD-INFLIGHT", "other", store.Response{Status: 500}, time.Hour); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("Commit(ORD-INFLIGHT) by another token: %v, want ErrNotOwner", err)
	}
	if err := s.Commit(c, "charges/-/ORD-INFLIGHT", "tok-inflight", store.Response{Status: 202}, time.Hour); err != nil {
		t.Fatalf("Commit(ORD-INFLIGHT): %v", err)
	}
	if rec, err := s.Get(c, "charges/-/ORD-INFLIGHT"); err != nil || rec == nil || rec.State != store.StateCompleted || rec.Response.Status != 202 {
		t.Errorf("Get after Commit = %+v, %v; want completed 202", rec, err)
	} else {
		near("committed expiry", rec.ExpiresAt, now.Add(time.Hour))
	}

	// Mark in doubt, then release: fenced.
	if err := s.MarkInDoubt(c, "charges/-/ORD-MARK", "tok-mark", 2*time.Hour); err != nil {
		t.Fatalf("MarkInDoubt(ORD-MARK): %v", err)
	}
	if rec, err := s.Get(c, "charges/-/ORD-MARK"); err != nil || rec == nil || rec.State != store.StateInDoubt {
		t.Errorf("Get after MarkInDoubt = %+v, %v; want in doubt", rec, err)
	} else {
		near("in-doubt expiry", rec.ExpiresAt, now.Add(2*time.Hour))
	}
	if err := s.Release(c, "charges/-/ORD-MARK", "other"); !errors.Is(err, store.ErrNotOwner) {
		t.Errorf("Release(ORD-MARK) by another token: %v, want ErrNotOwner", err)
	}
	if err := s.Release(c, "charges/-/ORD-MARK", "tok-mark"); err != nil {
		t.Fatalf("Release(ORD-MARK): %v", err)
	}
	if rec, err := s.Get(c, "charges/-/ORD-MARK"); err != nil || rec != nil {
		t.Errorf("Get after Release = %+v, %v; want none", rec, err)
	}
	// A committed answer is never changed, nor marked in doubt.
	if err := s.MarkInDoubt(c, "charges/-/ORD-DONE", "tok-done", time.Hour); err != nil {
		t.Errorf("MarkInDoubt(ORD-DONE): %v", err)
	}
	if rec, err := s.Get(c, "charges/-/ORD-DONE"); err != nil || rec == nil || rec.State != store.StateCompleted {
		t.Errorf("Get(ORD-DONE) after MarkInDoubt = %+v, %v; want still completed", rec, err)
	}

	// Reconcile the lapsed one: found unscheduled, scheduled, claimed and
	// resolved with the applied answer.
	keys, err := s.Unscheduled(c, "charges/", 10)
	if err != nil || !slices.Contains(keys, "charges/-/ORD-LAPSED") {
		t.Fatalf("Unscheduled = %v, %v; want ORD-LAPSED", keys, err)
	}
	if err := s.ScheduleLookup(c, "charges/-/ORD-LAPSED", 0); err != nil {
		t.Fatalf("ScheduleLookup: %v", err)
	}
	if err := s.ClaimLookup(c, "charges/-/ORD-LAPSED", "look", time.Minute, true); err != nil {
		t.Fatalf("ClaimLookup: %v", err)
	}
	if err := s.ResolveLookup(c, "charges/-/ORD-LAPSED", "look", store.LookupResult{Applied: &store.Response{Status: 201, Reconciled: true}}); err != nil {
		t.Fatalf("ResolveLookup: %v", err)
	}
	if rec, err := s.Get(c, "charges/-/ORD-LAPSED"); err != nil || rec == nil || rec.State != store.StateCompleted || !rec.Response.Reconciled {
		t.Errorf("Get after the lookup = %+v, %v; want completed, reconciled", rec, err)
	}
}

// TestRecordsArePacked: a reservation, a commit and an in-doubt mark are
// each one write of one Redis string (the packed layout), not a hash:
// INFO commandstats counts the writes Redis ran.
func TestRecordsArePacked(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newStore(t, Options{Addrs: []string{srv.Addr()}})
	raw := rawClient(t, srv.Addr())
	c := ctx(t)
	if err := raw.ConfigResetStat(c).Err(); err != nil {
		t.Fatal(err)
	}
	r := store.Reservation{Token: "t1", Fingerprint: "f1", Lease: time.Minute, TTL: time.Hour}
	for _, k := range []string{"a/-/1", "a/-/2"} {
		if rec, err := s.Reserve(c, k, r); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %+v, %v", k, rec, err)
		}
	}
	if err := s.Commit(c, "a/-/1", "t1", store.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkInDoubt(c, "a/-/2", "t1", time.Hour); err != nil {
		t.Fatal(err)
	}
	info, err := raw.Info(c, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := func(cmd string) int {
		m := regexp.MustCompile(`cmdstat_` + cmd + `:calls=(\d+)`).FindStringSubmatch(info)
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if got := calls("set"); got != 4 {
		t.Errorf("SET calls = %d, want 4 (two reservations, a commit, a mark)", got)
	}
	for _, cmd := range []string{"hset", "hdel", "pexpire"} {
		if got := calls(cmd); got != 0 {
			t.Errorf("%s calls = %d, want 0", strings.ToUpper(cmd), got)
		}
	}
	for k, want := range map[string]store.State{"a/-/1": store.StateCompleted, "a/-/2": store.StateInDoubt} {
		if typ := raw.Type(c, s.prefix+k).Val(); typ != "string" {
			t.Errorf("%s is a %s, want a string", k, typ)
		}
		if st := rawState(c, raw, s.prefix+k); st != string(want) {
			t.Errorf("%s packed state %q, want %q", k, st, want)
		}
	}
}
