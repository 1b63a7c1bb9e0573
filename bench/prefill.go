//go:build unix

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/config"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
	pgstore "github.com/idemproxy/idemproxy/store/postgres"
	redisstore "github.com/idemproxy/idemproxy/store/redis"
)

// prefillStore writes n completed keys into the Badger store in dir, each
// as the proxy stores an answer of the stub: a 201 with its JSON charge.
func prefillStore(dir string, n int, ttl time.Duration) error {
	s, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		return err
	}
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	ctx := context.Background()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if _, err := storeAnswer(ctx, s, fmt.Sprintf("prefill-%d-%d", w, i), ttl); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		s.Close()
		return err
	}
	return s.Close()
}

// count is n for a target's name: 1M, 250k, 5000.
func count(n int) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

// storeAnswer stores one completed key through s, with orderID as the
// key, as the proxy stores an answer of the stub: a 201 with its JSON
// charge. It returns the store key.
func storeAnswer(ctx context.Context, s store.Store, orderID string, ttl time.Duration) (string, error) {
	key := store.Key("charges", "", orderID)
	token := rand.Text()
	sum := sha256.Sum256([]byte(key))
	res := store.Reservation{Token: token, Fingerprint: hex.EncodeToString(sum[:]), Lease: min(ttl/2, time.Minute), TTL: ttl}
	if _, err := s.Reserve(ctx, key, res); err != nil {
		return "", err
	}
	body := fmt.Sprintf(`{"chargeId":"ch_%s","orderId":"%s","amount":10,"createdAt":"%s"}`,
		rand.Text(), orderID, time.Now().UTC().Format(time.RFC3339Nano))
	resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body), BodyStored: true}
	return key, s.Commit(ctx, key, token, resp, ttl)
}

// prefillRedis stores n completed keys in the Redis at addrs (a Redis
// Cluster's nodes with cluster set), under the default key prefix: one
// through the store, the others copies of its value (DUMP and RESTORE,
// pipelined; a Cluster's pipeline sends each key to its node), each with
// its own key.
func prefillRedis(addrs []string, cluster bool, n int, ttl time.Duration) error {
	s, err := redisstore.New(redisstore.Options{Addrs: addrs, ClusterMode: cluster, KeyPrefix: config.DefaultRedisKeyPrefix,
		DialTimeout: time.Second, OpTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	key, err := storeAnswer(context.Background(), s, "prefill-seed", ttl)
	s.Close()
	if err != nil {
		return err
	}
	ctx := context.Background()
	var c goredis.UniversalClient = goredis.NewClient(&goredis.Options{Addr: addrs[0]})
	if cluster {
		c = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	}
	defer c.Close()
	dump, err := c.Dump(ctx, config.DefaultRedisKeyPrefix+key).Result()
	if err != nil {
		return fmt.Errorf("dump %s: %w", key, err)
	}
	const batch = 2000
	for i := 0; i < n; i += batch {
		p := c.Pipeline()
		for j := i; j < min(n, i+batch); j++ {
			p.Restore(ctx, config.DefaultRedisKeyPrefix+store.Key("charges", "", fmt.Sprintf("prefill-%d", j)), ttl, dump)
		}
		if _, err := p.Exec(ctx); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	return nil
}

// prefillPostgres stores n completed keys in the PostgreSQL server at dsn:
// one through the store (which creates the table), the others copies of
// its row, each with its own key.
func prefillPostgres(dsn string, n int, ttl time.Duration) error {
	ctx := context.Background()
	s, err := pgstore.New(ctx, pgstore.Options{DSN: dsn, SweepInterval: -1})
	if err != nil {
		return err
	}
	key, err := storeAnswer(context.Background(), s, "prefill-seed", ttl)
	s.Close()
	if err != nil {
		return err
	}
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	const batch = 100_000
	for i := 0; i < n; i += batch {
		_, err := c.Exec(ctx, `INSERT INTO `+pgstore.DefaultTable+`
SELECT (jsonb_populate_record(NULL::`+pgstore.DefaultTable+`, to_jsonb(t) || jsonb_build_object('key', $2::text || g))).*
FROM `+pgstore.DefaultTable+` t, generate_series($3::int, $4::int) g WHERE t.key = $1`,
			key, store.Key("charges", "", "prefill-"), i, min(n, i+batch)-1)
		if err != nil {
			return fmt.Errorf("copy rows: %w", err)
		}
	}
	if _, err = c.Exec(ctx, `VACUUM ANALYZE `+pgstore.DefaultTable); err != nil {
		return err
	}
	// Written to the data files now, not by the checkpointer during the
	// measurements.
	_, err = c.Exec(ctx, `CHECKPOINT`)
	return err
}

// settle writes every dirty page of the machine back to disk and waits
// until the kernel has (at most a minute), so that the measurements do not
// pay for the prefills' writes.
func settle() {
	t0 := time.Now()
	syscall.Sync()
	for time.Since(t0) < time.Minute && procMeminfo("Dirty")+procMeminfo("Writeback") > 16<<20 {
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Printf("prefills written back in %s\n", time.Since(t0).Round(100*time.Millisecond))
}

// procMeminfo reads one kB field of /proc/meminfo, in bytes.
func procMeminfo(field string) int64 { return kBField("/proc/meminfo", field) }
