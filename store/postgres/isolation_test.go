package postgres_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/pgtest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// TestStricterDefaultIsolation: a database (or role) whose
// default_transaction_isolation is repeatable read or serializable, as
// some teams set it, must not change what the store answers. Under those
// levels PostgreSQL fails a statement that meets a row changed by a
// concurrent transaction (SQLSTATE 40001) where read committed re-reads
// it: a storm of one key would give the duplicates errors (503s) instead
// of the record, and the owner's commit could fail.
func TestStricterDefaultIsolation(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			srv.MustExec(fmt.Sprintf(`ALTER DATABASE postgres SET default_transaction_isolation = '%s'`, level))
			defer srv.MustExec(`ALTER DATABASE postgres RESET default_transaction_isolation`)
			a := newStore(t, srv, postgres.Options{Table: "iso"})
			b := newStore(t, srv, postgres.Options{Table: "iso"})
			c := ctx(t)
			resp := store.Response{Status: 201, Body: []byte("charged"), BodyStored: true}
			for round := range 20 {
				key := fmt.Sprintf("r/-/%s-%d", level, round)
				var (
					wg       sync.WaitGroup
					mu       sync.Mutex
					owners   []string
					failures []error
				)
				for i := range 16 {
					s := a
					if i%2 == 1 {
						s = b
					}
					wg.Go(func() {
						tok := fmt.Sprintf("t%d", i)
						rec, err := s.Reserve(c, key, store.Reservation{Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
						if err == nil && rec == nil {
							err = s.Commit(c, key, tok, resp, time.Hour)
							mu.Lock()
							owners = append(owners, tok)
							mu.Unlock()
						}
						if err != nil {
							mu.Lock()
							failures = append(failures, err)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				if len(owners) != 1 || len(failures) != 0 {
					t.Fatalf("round %d: owners %q, errors %v; want one owner and no errors", round, owners, failures)
				}
			}
		})
	}
}
