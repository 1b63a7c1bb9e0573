package redis

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv/redistest"
	"github.com/idemproxy/idemproxy/store"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestEpochConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore {
		return newStore(t, Options{Addrs: []string{srv.Addr()}})
	})
	c := redistest.StartCluster(t, 3)
	t.Run("cluster", func(t *testing.T) {
		storetest.RunEpoch(t, func(t *testing.T) storetest.EpochStore {
			return newStore(t, Options{Addrs: c.Addrs()})
		})
	})
}

func TestKeyspaceConformance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	storetest.RunKeyspaces(t, func(t *testing.T) storetest.KeyspaceStore {
		return newStore(t, Options{Addrs: []string{srv.Addr()}})
	})
	c := redistest.StartCluster(t, 3)
	t.Run("cluster", func(t *testing.T) {
		storetest.RunKeyspaces(t, func(t *testing.T) storetest.KeyspaceStore {
			return newStore(t, Options{Addrs: c.Addrs()})
		})
	})
}

// TestReserveChecksTheEpoch: with ExpectEpoch, a reservation on a Redis
// whose marker is gone (FLUSHALL: the connections stay open, so no new
// connection tells) is refused with store.ErrKeysLost, and nothing is
// written; EpochSeen hears of it. For both record layouts.
func TestReserveChecksTheEpoch(t *testing.T) {
	t.Parallel()
	for _, layout := range []RecordLayout{layoutPacked, layoutHash} {
		t.Run(string(layout), func(t *testing.T) { reserveChecksTheEpoch(t, layout) })
	}
}

func reserveChecksTheEpoch(t *testing.T, layout RecordLayout) {
	srv := redistest.Start(t)
	var seen atomic.Int64
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, RecordLayout: layout, EpochSeen: func(m *store.Epoch, read bool) error {
		if read && m == nil {
			seen.Add(1)
		}
		return nil
	}})
	e := store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}
	if _, ok, err := s.SwapEpoch(ctx(t), "", e); err != nil || !ok {
		t.Fatalf("SwapEpoch = %v, %v", ok, err)
	}
	s.ExpectEpoch("e1")
	if rec, err := s.Reserve(ctx(t), "r/-/before", res); err != nil || rec != nil {
		t.Fatalf("Reserve with the marker in place = %+v, %v; want reserved", rec, err)
	}
	want := map[RecordLayout]string{layoutPacked: "string", layoutHash: "hash"}[layout]
	if typ, _ := srv.Do("TYPE", s.prefix+"r/-/before"); typ != want {
		t.Errorf("the reservation checked against the epoch is a %s, want a %s", typ, want)
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	_, err := s.Reserve(ctx(t), "r/-/after", res)
	if !errors.Is(err, store.ErrKeysLost) {
		t.Fatalf("Reserve after FLUSHALL: err = %v, want ErrKeysLost", err)
	}
	if n, _ := srv.Do("EXISTS", s.prefix+"r/-/after"); n != "0" {
		t.Errorf("the refused reservation was written (EXISTS = %s)", n)
	}
	if seen.Load() == 0 {
		t.Error("EpochSeen was not told of the missing marker")
	}
	s.ExpectEpoch("")
	if rec, err := s.Reserve(ctx(t), "r/-/unchecked", res); err != nil || rec != nil {
		t.Fatalf("Reserve without an expected epoch = %+v, %v; want reserved", rec, err)
	}
}

// TestNewConnectionChecksTheEpoch: a Redis restarted empty is seen on the
// first new connection, and EpochSeen's error fails it before anything is
// reserved on it.
func TestNewConnectionChecksTheEpoch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var refuse atomic.Bool
	var calls atomic.Int64
	s := newStore(t, Options{Addrs: []string{srv.Addr()}, EpochSeen: func(m *store.Epoch, read bool) error {
		calls.Add(1)
		if refuse.Load() && m == nil {
			return fmt.Errorf("%w: marker missing", store.ErrKeysLost)
		}
		return nil
	}})
	if _, _, err := s.SwapEpoch(ctx(t), "", store.Epoch{ID: "e1", State: store.EpochEstablished, Gen: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx(t), "r/-/a", res); err != nil {
		t.Fatal(err)
	}
	if calls.Load() == 0 {
		t.Fatal("EpochSeen was not called for the first connection")
	}
	refuse.Store(true)
	srv.Restart() // no persistence: empty
	_, err := s.Reserve(ctx(t), "r/-/b", res)
	if err == nil {
		t.Fatal("Reserve on the restarted, empty Redis succeeded; want the new connection refused")
	}
	if n, _ := srv.Do("DBSIZE"); n != "0" {
		t.Errorf("DBSIZE after the refused reservation = %s, want 0", n)
	}
}

// TestConfigRisks: a Redis that would forget (an eviction policy with a
// maxmemory, no persistence) is named; one with noeviction and the
// append-only file is not, nor one whose policy evicts nothing without a
// maxmemory; a Redis that refuses CONFIG is no error, and its persistence
// is not judged.
func TestConfigRisks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"no persistence", []string{"--save", ""}, []string{riskNoPersistence}},
		{"an eviction policy, snapshots on", []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru", "--save", "60 1"}, []string{riskEviction}},
		{"an eviction policy without maxmemory", []string{"--maxmemory-policy", "allkeys-lru"}, nil},
		{"noeviction with the append-only file", []string{"--save", "", "--appendonly", "yes"}, nil},
		{"CONFIG refused", []string{"--save", "", "--rename-command", "CONFIG", ""}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t, c.args...)
			s := newStore(t, Options{Addrs: []string{srv.Addr()}})
			if err := s.CheckSettings(ctx(t)); err != nil {
				t.Fatal(err)
			}
			risks := s.Risks()
			var got []string
			for _, r := range Risks {
				if risks[r] != "" {
					got = append(got, r)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("risks = %v (%v), want %v", got, risks, c.want)
			}
		})
	}
}
