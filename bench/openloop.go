//go:build unix

package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Open-loop load.
//
// A closed-loop driver (wrk, loadGo) sends the next request of a
// connection when the previous one is answered: when the proxy slows down,
// so does the load, and the slow moments are measured by the few requests
// that were waiting, not by the many that would have been sent meanwhile
// (coordinated omission). loadOpen instead sends request i at its intended
// time start + i/rate, whatever happened to the others, and measures each
// request's latency from that intended time: a request that had to wait
// for a free worker, because the proxy stalled, counts its wait.

// maxInFlight bounds the requests outstanding at once (each holds a
// connection). At 2,500/s it allows 200 ms of stall before a request
// waits for a worker; the waiting is then measured, not hidden.
const maxInFlight = 512

// openStats is one open-loop run's result.
type openStats struct {
	sent, requests int64 // scheduled; answered (errors included)
	errors         int64 // transport errors and statuses other than 201
	elapsed        time.Duration
	lats           []time.Duration // sorted, from each request's intended start
}

// quantile is the q-quantile of the latencies (0: none).
func (s openStats) quantile(q float64) time.Duration {
	if len(s.lats) == 0 {
		return 0
	}
	return s.lats[min(len(s.lats)-1, int(q*float64(len(s.lats))))]
}

func (s openStats) max() time.Duration {
	if len(s.lats) == 0 {
		return 0
	}
	return s.lats[len(s.lats)-1]
}

// loadOpen sends unique-key charges to addr at rate per second for d,
// open-loop, and returns once every request is answered or timed out.
func loadOpen(addr string, rate int, d time.Duration, prefix string) (openStats, error) {
	if rate <= 0 {
		return openStats{}, errors.New("rate must be positive")
	}
	n := int(int64(rate) * int64(d) / int64(time.Second))
	tr := &http.Transport{MaxIdleConnsPerHost: maxInFlight, MaxConnsPerHost: maxInFlight, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://" + addr + "/charges"

	type job struct {
		i      int
		intend time.Time
	}
	jobs := make(chan job, n) // never blocks the scheduler
	var (
		errs, done atomic.Int64
		mu         sync.Mutex
		lats       = make([]time.Duration, 0, n)
		wg         sync.WaitGroup
	)
	for range maxInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, n/maxInFlight+16)
			var sb strings.Builder
			for j := range jobs {
				sb.Reset()
				fmt.Fprintf(&sb, `{"orderId": "%s-%d", "amount": 10, "sentAt": "2026-12-01T10:00:00Z"}`, prefix, j.i)
				resp, err := c.Post(url, "application/json", strings.NewReader(sb.String()))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					errs.Add(1)
				}
				// A failed request counts with the time it took to fail.
				mine = append(mine, time.Since(j.intend))
				done.Add(1)
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i := range n {
		intend := start.Add(time.Duration(i) * interval)
		if w := time.Until(intend); w > 0 {
			time.Sleep(w)
		}
		// Sent late when the sleep overslept: still timed from intend.
		jobs <- job{i: i, intend: intend}
	}
	close(jobs)
	wg.Wait()
	el := time.Since(start)
	if len(lats) == 0 {
		return openStats{}, errors.New("no request completed")
	}
	slices.Sort(lats)
	return openStats{sent: int64(n), requests: done.Load(), errors: errs.Load(), elapsed: el, lats: lats}, nil
}
