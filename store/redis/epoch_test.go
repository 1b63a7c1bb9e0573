package redis

import (
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestEpochConformance(t *testing.T) {
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
