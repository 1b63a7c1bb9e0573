package epoch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/store"
)

// memStore is an in-memory marker with the contract of store.EpochStore
// (store/storetest runs the same contract against the real backends); it
// can forget, as a restarted Redis does, and fail, as an unreachable one.
type memStore struct {
	mu   sync.Mutex
	m    *store.Epoch
	down bool
}

func (s *memStore) Epoch(context.Context) (*store.Epoch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, errors.New("connection refused")
	}
	if s.m == nil {
		return nil, nil
	}
	e := *s.m
	return &e, nil
}

func (s *memStore) SwapEpoch(_ context.Context, old string, e store.Epoch) (*store.Epoch, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, false, errors.New("connection refused")
	}
	id := ""
	if s.m != nil {
		id = s.m.ID
	}
	if id != old {
		c := *s.m
		return &c, false, nil
	}
	s.m = &e
	return &e, true, nil
}

// step is one event of a scenario: a replica checks (or verifies a new
// connection's marker), the store forgets or fails, an operator accepts,
// time passes.
type step struct {
	after   time.Duration // the clock moves on first
	who     string        // the replica: "a", "b", "c"
	do      string        // check, verify, marklost, wipe, down, up, accept, restore
	want    State         // the replica's state after the step (check, verify)
	wantErr error         // Err after the step: nil, store.ErrKeysLost, errNotChecked
}

func TestWatcherRules(t *testing.T) {
	const grace = 6 * time.Second
	cases := []struct {
		name  string
		grace time.Duration
		steps []step
	}{
		{"a first start on an empty store needs no operator, after the grace", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: 2 * time.Second, who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace, who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK}, // established: a newcomer trusts it at once
		}},
		{"without a grace (Badger) a new store is trusted at once, and a restart keeps it", 0, []step{
			{who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK},
		}},
		{"before any check nothing is served, and an unreachable store changes nothing", grace, []step{
			{do: "down"},
			{who: "a", do: "check", want: Unknown, wantErr: errNotChecked},
			{do: "up"},
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
		}},
		{"without a grace an unreachable store answers for itself before the first check", 0, []step{
			{do: "down"},
			{who: "a", do: "check", want: Unknown, wantErr: nil},
			{do: "up"},
			{who: "a", do: "check", want: OK},
		}},
		{"a store that forgot is lost for everyone, newcomers included, until accepted", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace, who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK},
			{do: "wipe"},
			{who: "a", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{who: "b", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{who: "c", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{after: time.Hour, who: "c", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{do: "accept"},
			{who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK},
			{who: "c", do: "check", want: OK},
		}},
		{"a newcomer's new marker on a forgetful store meets an objection in its grace", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace, who: "a", do: "check", want: OK},
			{do: "wipe"},
			{who: "c", do: "check", want: Establishing, wantErr: store.ErrKeysLost}, // c writes a new marker
			{after: time.Second, who: "a", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{after: grace, who: "c", do: "check", want: Lost, wantErr: store.ErrKeysLost},
		}},
		{"a second newcomer waits for the first one's new marker too", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace - time.Second, who: "b", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: time.Second, who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK}, // a established it
		}},
		{"a marker gone during its grace is written anew, and the grace starts over", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace - time.Second, do: "wipe"},
			{after: time.Second, who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace - time.Second, who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: time.Second, who: "a", do: "check", want: OK},
		}},
		{"a new connection that sees the marker gone stops the replica before the next check", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace, who: "a", do: "check", want: OK},
			{do: "wipe"},
			{who: "a", do: "verify", want: Lost, wantErr: store.ErrKeysLost},
			{who: "b", do: "check", want: Establishing, wantErr: store.ErrKeysLost}, // nothing written yet
			{who: "a", do: "check", want: Lost, wantErr: store.ErrKeysLost},         // now it is
			{after: grace, who: "b", do: "check", want: Lost, wantErr: store.ErrKeysLost},
		}},
		{"a loss seen by other means (a canary) is lost for everyone until accepted, the marker intact", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{who: "b", do: "marklost", want: Unknown, wantErr: errNotChecked}, // trusts nothing: nothing to lose
			{after: grace, who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK},
			{who: "a", do: "marklost", want: Lost, wantErr: store.ErrKeysLost},
			{who: "b", do: "check", want: OK}, // the lost marker is not written yet
			{who: "a", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{who: "b", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{who: "c", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{who: "a", do: "marklost", want: Lost, wantErr: store.ErrKeysLost},
			{do: "accept"},
			{who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK},
		}},
		{"an acceptance written on the empty store before anyone marked it lost is adopted", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace, who: "a", do: "check", want: OK},
			{do: "wipe"},
			{after: time.Minute, do: "accept"}, // the CLI, seeing no marker
			{who: "a", do: "check", want: OK},
			{who: "b", do: "check", want: OK},
		}},
		{"a store restored from a backup with an older acceptance is lost, not adopted", grace, []step{
			{who: "a", do: "check", want: Establishing, wantErr: store.ErrKeysLost},
			{after: grace, who: "a", do: "check", want: OK},
			{do: "accept"}, // gen 3, the backup's marker
			{who: "a", do: "check", want: OK},
			{do: "snapshot"},
			{do: "accept"}, // gen 4
			{who: "a", do: "check", want: OK},
			{do: "restore"}, // gen 3 again
			{who: "a", do: "check", want: Lost, wantErr: store.ErrKeysLost},
			{do: "accept"},
			{who: "a", do: "check", want: OK},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			st := &memStore{}
			now := time.Unix(1_700_000_000, 0)
			watchers := map[string]*Watcher{}
			var snapshot *store.Epoch
			for i, s := range c.steps {
				now = now.Add(s.after)
				w := watchers[s.who]
				if w == nil && s.who != "" {
					w = New(Options{Store: st, Interval: 2 * time.Second, Grace: c.grace, Now: func() time.Time { return now }})
					watchers[s.who] = w
				}
				switch s.do {
				case "check":
					_ = w.Check(ctx)
				case "verify":
					m, _ := st.Epoch(ctx)
					if err := w.Verify(m); !errors.Is(err, store.ErrKeysLost) {
						t.Fatalf("step %d: Verify = %v, want ErrKeysLost", i, err)
					}
				case "marklost":
					w.MarkLost("a canary is missing")
				case "wipe":
					st.m = nil
				case "down", "up":
					st.down = s.do == "down"
				case "snapshot":
					e := *st.m
					snapshot = &e
				case "restore":
					st.m = snapshot
				case "accept":
					if _, _, err := Accept(ctx, st, "op", "test", now, 0); err != nil {
						t.Fatalf("step %d: Accept: %v", i, err)
					}
				}
				if w == nil {
					continue
				}
				if got := w.Status().State; got != s.want {
					t.Fatalf("step %d (%s %s): state %v, want %v", i, s.who, s.do, got, s.want)
				}
				if err := w.Err(); !errors.Is(err, s.wantErr) || (err == nil) != (s.wantErr == nil) {
					t.Fatalf("step %d (%s %s): Err = %v, want %v", i, s.who, s.do, err, s.wantErr)
				}
			}
		})
	}
}

// TestWatcherCountsChanges: the counter behind
// idemproxy_store_epoch_changes_total counts each loss this replica saw,
// once.
func TestWatcherCountsChanges(t *testing.T) {
	ctx := context.Background()
	st := &memStore{}
	w := New(Options{Store: st, Interval: time.Second})
	for range 3 {
		w.Check(ctx)
	}
	if got := w.Changes(); got != 0 {
		t.Fatalf("changes before a loss = %d, want 0", got)
	}
	st.m = nil
	for range 3 {
		w.Check(ctx)
	}
	if got := w.Changes(); got != 1 {
		t.Fatalf("changes after one loss = %d, want 1", got)
	}
	Accept(ctx, st, "op", "", time.Now(), 0)
	w.Check(ctx)
	st.m = nil
	w.Check(ctx)
	if got := w.Changes(); got != 2 {
		t.Fatalf("changes after a second loss = %d, want 2", got)
	}
}
