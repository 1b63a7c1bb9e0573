package badger

import "errors"

// A fault is an error of the store itself: Badger failed to read, write or
// commit, the reservation log or its sync failed, the writer stalled or is
// closed, Badger panicked. Only a fault makes the Guard reopen the store
// (close it and replay the log); any other error (the caller's context,
// fencing, a record in another state, a refused value, a damaged record)
// is answered as it is. Faults are typed where Badger is called (wtxn,
// view, get, the writer's commit), so an error that a new check returns
// elsewhere is never taken for a broken store: marking one a fault is a
// decision, not a default.
type fault struct{ err error }

func (f *fault) Error() string { return f.err.Error() }
func (f *fault) Unwrap() error { return f.err }

// asFault marks err, when not nil, as a fault of the store.
func asFault(err error) error {
	if err == nil || isFault(err) {
		return err
	}
	return &fault{err}
}

// isFault reports whether err, or an error it wraps, is a fault of the
// store.
func isFault(err error) bool {
	var f *fault
	return errors.As(err, &f)
}
