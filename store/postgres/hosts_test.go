package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv/testrun"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestAFrozenFirstHostIsPassedOver: the DSN lists the old primary and the
// new one (target_session_attrs=read-write), as for a failover, and the
// first host is frozen (a hung host, a partition: connections are accepted
// and nothing answers). Each host is given connect_timeout, as libpq and
// pgx do, so a new connection reaches the second host after the first's
// timeout. The store must then start (a proxy restarted during the
// failover) and take a reservation, not give up on the whole host list
// after one host's connect_timeout.
//
// connect_timeout is the machine's: 5 times the slowest of three
// reservations on a new connection to the live host alone (500 ms at
// least), so that the live host is reached within it on a busy machine
// too.
func TestAFrozenFirstHostIsPassedOver(t *testing.T) {
	frozen := pgtest.Start(t)
	live := pgtest.Start(t)
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alone := newStore(t, live, postgres.Options{Table: "hosts"})
	var i int
	connect := testrun.Pace(func() {
		alone.ResetPool()
		i++
		if _, err := alone.Reserve(c, fmt.Sprintf("r/-/pace-%d", i), store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatalf("Reserve on a new connection to the live host alone: %v", err)
		}
	})
	timeout := max(500*time.Millisecond, 5*connect)
	t.Logf("a reservation on a new connection takes %v: connect_timeout %v", connect, timeout)
	frozen.Pause()
	defer frozen.Resume()
	dsn := fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		pgtest.User, frozen.Port(), live.Port())
	c, cancel = context.WithTimeout(context.Background(), 30*time.Second+4*timeout)
	defer cancel()
	s, err := postgres.New(c, postgres.Options{
		DSN: dsn, Table: "hosts", ConnectTimeout: timeout, StatementTimeout: postgres.DefaultStatementTimeout,
	})
	if err != nil {
		t.Fatalf("New with the first host frozen: %v", err)
	}
	defer s.Close()
	// The connection New used is pooled: a reservation that needs a new
	// one (the pool emptied, as after the failover) goes past the frozen
	// host too.
	s.ResetPool()
	rec, err := s.Reserve(c, "r/-/k", store.Reservation{Token: "t", Lease: time.Minute, TTL: time.Hour})
	if err != nil || rec != nil {
		t.Errorf("Reserve on a new connection with the first host frozen = %+v, %v; want nil, nil", rec, err)
	}
}
