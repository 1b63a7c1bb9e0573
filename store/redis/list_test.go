package redis

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestListConformance(t *testing.T) {
	srv := redistest.Start(t)
	storetest.RunList(t, func(t *testing.T) storetest.ListStore {
		return newStore(t, Options{Addrs: []string{srv.Addr()}})
	})
	// On a Cluster a listing goes through the masters one after the other.
	c := redistest.StartCluster(t, 3)
	t.Run("cluster", func(t *testing.T) {
		storetest.RunList(t, func(t *testing.T) storetest.ListStore {
			return newStore(t, Options{Addrs: c.Addrs()})
		})
	})
}
