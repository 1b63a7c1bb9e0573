package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestFailoverToASynchronousStandbyKeepsAcknowledgedReservations: with
// synchronous_commit on and the standby in synchronous_standby_names, every
// reservation the store acknowledged is on the standby; the primary is
// killed, the standby promoted, and the same Store (its DSN lists both
// hosts, read-write sessions only) finds every one of them, so no retry is
// forwarded a second time, and takes new reservations. (On one machine an
// asynchronous standby is usually caught up as well; the synchronous
// state checked first is what makes the promise hold under lag.)
func TestFailoverToASynchronousStandbyKeepsAcknowledgedReservations(t *testing.T) {
	t.Parallel()
	primary := pgtest.Start(t, "synchronous_standby_names="+pgtest.ApplicationName, "synchronous_commit=on")
	standby := pgtest.StartStandby(t, primary)
	dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		pgtest.User, primary.Port(), standby.Port())
	s := newStore(t, primary, postgres.Options{
		DSN: dsn, Table: "failover", SynchronousCommit: "on",
		ConnectTimeout: postgres.DefaultConnectTimeout, StatementTimeout: 2 * time.Second,
	})
	if got := primary.MustExec("SELECT sync_state FROM pg_stat_replication"); got != "sync" {
		t.Fatalf("the standby's sync_state = %q; want sync", got)
	}
	c := ctx(t)
	const n = 50
	for i := range n {
		key := fmt.Sprintf("r/-/%d", i)
		if rec, err := s.Reserve(c, key, store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
			t.Fatalf("Reserve(%s) = %+v, %v", key, rec, err)
		}
	}
	primary.Kill()
	standby.Promote()
	for deadline := time.Now().Add(hangGuard); ; time.Sleep(100 * time.Millisecond) {
		err := s.Ping(c)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ping after the failover: %v", err)
		}
	}
	for i := range n {
		key := fmt.Sprintf("r/-/%d", i)
		rec, err := s.Reserve(c, key, store.Reservation{Token: "retry", Lease: time.Minute, TTL: time.Hour})
		if err != nil || rec == nil || rec.Token != "t" {
			t.Errorf("the retry of %s after the failover: Reserve = %+v, %v; want the acknowledged reservation", key, rec, err)
		}
	}
	if rec, err := s.Reserve(c, "r/-/new", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil || rec != nil {
		t.Errorf("Reserve of a new key on the promoted standby = %+v, %v; want nil, nil", rec, err)
	}
}

// TestNewRefusesAStandby: a DSN that leads to a read-only standby fails New
// with an error saying so.
func TestNewRefusesAStandby(t *testing.T) {
	t.Parallel()
	primary := pgtest.Start(t)
	standby := pgtest.StartStandby(t, primary)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.New(ctx, postgres.Options{DSN: standby.DSN()})
	if err == nil {
		s.Close()
		t.Fatal("New on a standby = nil error; want it refused")
	}
	if !strings.Contains(err.Error(), "standby") {
		t.Errorf("New on a standby: %v; want it to say standby", err)
	}
}
