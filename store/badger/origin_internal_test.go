package badger

import (
	"context"
	"testing"
	"time"

	bdg "github.com/dgraph-io/badger/v4"

	"github.com/idemproxy/idemproxy/store"
)

// TestRecordsOfThePreviousReleaseHaveNoOrigin: records the release before
// origins wrote (their bytes by hand: no origin field) are read, committed
// and marked in doubt by this one, with an empty Origin.
func TestRecordsOfThePreviousReleaseHaveNoOrigin(t *testing.T) {
	t.Parallel()
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	now := time.Now()
	varint := func(ms int64) []byte { // a varint field's payload, zig-zag
		var b []byte
		for u := uint64(ms<<1) ^ uint64(ms>>63); ; u >>= 7 {
			if u < 0x80 {
				return append(b, byte(u))
			}
			b = append(b, byte(u)|0x80)
		}
	}
	field := func(tag byte, p []byte) []byte { return append([]byte{tag, byte(len(p))}, p...) }
	inFlight := func(tok string, lease time.Time) []byte {
		v := []byte{recordVersion}
		v = append(v, field(tagState, []byte{1})...)
		v = append(v, field(tagToken, []byte(tok))...)
		v = append(v, field(tagFingerprint, []byte("fp"))...)
		v = append(v, field(tagCreatedAt, varint(now.UnixMilli()))...)
		return append(v, field(tagLease, varint(lease.UnixMilli()))...)
	}
	completed := []byte{recordVersion}
	completed = append(completed, field(tagState, []byte{2})...)
	completed = append(completed, field(tagToken, []byte("tok-done"))...)
	completed = append(completed, field(tagFingerprint, []byte("fp"))...)
	completed = append(completed, field(tagCreatedAt, varint(now.UnixMilli()))...)
	completed = append(completed, field(tagStatus, varint(201))...)
	completed = append(completed, field(tagBody, []byte(`{"id":1}`))...)
	completed = append(completed, field(tagBodyStored, []byte{1})...)

	old := []struct {
		key  string
		meta byte
		v    []byte
	}{
		{"charges/-/ORD-INFLIGHT", metaInFlight, inFlight("tok-inflight", now.Add(time.Hour))},
		{"charges/-/ORD-LAPSED", metaInFlight, inFlight("tok-lapsed", now.Add(-time.Second))},
		{"charges/-/ORD-MARK", metaInFlight, inFlight("tok-mark", now.Add(time.Hour))},
		{"charges/-/ORD-DONE", metaCompleted, completed},
	}
	err = s.update(func(txn *wtxn) error {
		for _, r := range old {
			e := bdg.NewEntry([]byte(r.key), r.v).WithMeta(r.meta)
			e.ExpiresAt = uint64(now.Add(time.Hour).Unix())
			if err := txn.SetEntry(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "charges/-/ORD-INFLIGHT", "tok-inflight", store.Response{Status: 201, BodyStored: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkInDoubt(ctx, "charges/-/ORD-MARK", "tok-mark", time.Hour); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		want store.State
	}{
		{"charges/-/ORD-INFLIGHT", store.StateCompleted},
		{"charges/-/ORD-LAPSED", store.StateInDoubt},
		{"charges/-/ORD-MARK", store.StateInDoubt},
		{"charges/-/ORD-DONE", store.StateCompleted},
	}
	for _, tt := range tests {
		rec, err := s.Get(ctx, tt.key)
		if err != nil || rec == nil {
			t.Fatalf("Get(%q) = %+v, %v; want the record", tt.key, rec, err)
		}
		if rec.State != tt.want || rec.Origin != "" {
			t.Errorf("Get(%q): state %s, origin %q; want %s, no origin", tt.key, rec.State, rec.Origin, tt.want)
		}
		got, err := s.Reserve(ctx, tt.key, store.Reservation{Token: "tok-new", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour,
			Origin: "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"})
		if err != nil || got == nil || got.Origin != "" {
			t.Errorf("Reserve(%q) = %+v, %v; want the earlier record, without origin", tt.key, got, err)
		}
	}
	if rec, _ := s.Get(ctx, "charges/-/ORD-DONE"); rec == nil || rec.Response == nil || string(rec.Response.Body) != `{"id":1}` {
		t.Errorf("the completed record of the previous release = %+v, want its answer", rec)
	}
}
