package postgres

// ResetPool closes the Store's pooled connections, so that the next call
// opens a new one (as after a failover, when every pooled connection has
// died).
func (s *Store) ResetPool() { s.pool.Reset() }

// AlwaysBatch makes every write of the Store go through a batch, also one
// made while nothing else runs (which would run alone).
func (s *Store) AlwaysBatch() {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	s.batch.noAlone = true
}

// Queued returns the number of writes waiting for a batch.
func (s *Store) Queued() int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return s.batch.queued
}

// Serial makes the Store run one write or batch at a time, however long it
// waits (a gate's row lock): what is written meanwhile queues behind it.
func (s *Store) Serial() {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	s.batch.serial = true
}

// MaxQueued is the bound on the writes waiting for a batch.
const MaxQueued = maxQueued
