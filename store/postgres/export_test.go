package postgres

// ResetPool closes the Store's pooled connections, so that the next call
// opens a new one (as after a failover, when every pooled connection has
// died).
func (s *Store) ResetPool() { s.pool.Reset() }
