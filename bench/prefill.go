package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/badger"
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
				key := store.Key("charges", "", fmt.Sprintf("prefill-%d-%d", w, i))
				sum := sha256.Sum256([]byte(key))
				token := rand.Text()
				res := store.Reservation{Token: token, Fingerprint: hex.EncodeToString(sum[:]), Lease: min(ttl/2, time.Minute), TTL: ttl}
				if _, err := s.Reserve(ctx, key, res); err != nil {
					errs <- err
					return
				}
				body := fmt.Sprintf(`{"chargeId":"ch_%s","orderId":"prefill-%d-%d","amount":10,"createdAt":"%s"}`,
					rand.Text(), w, i, time.Now().UTC().Format(time.RFC3339Nano))
				resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body), BodyStored: true}
				if err := s.Commit(ctx, key, token, resp, ttl); err != nil {
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
