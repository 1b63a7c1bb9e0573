package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestStoreKindsAreTheStoreSections: every section of store (a pointer to
// a struct) is a kind of storeKinds, found under its own yaml name, and
// every kind is a section: a section added to Store without its line in
// storeKinds would never be selected, defaulted or validated.
func TestStoreKindsAreTheStoreSections(t *testing.T) {
	st := reflect.TypeFor[Store]()
	var sections []string
	for i := range st.NumField() {
		f := st.Field(i)
		if f.Type.Kind() != reflect.Pointer || f.Type.Elem().Kind() != reflect.Struct {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		sections = append(sections, name)
		var s Store
		reflect.ValueOf(&s).Elem().Field(i).Set(reflect.New(f.Type.Elem()))
		if got := s.Kind(); got != name {
			t.Errorf("a Store with only store.%s set selects kind %q; want %q: add the section to storeKinds (config/stores.go)", name, got, name)
		}
	}
	if kinds := StoreKinds(); !slices.Equal(kinds, sections) {
		t.Errorf("StoreKinds() = %q; the sections of store are %q, in the same order", kinds, sections)
	}
	if !slices.Contains(StoreKinds(), defaultStore) {
		t.Errorf("DefaultStore %q is not a kind of store %q", defaultStore, StoreKinds())
	}
}

// TestStoreKindSelected: the kind a loaded configuration selects is the
// section it sets, Badger when it sets none; two sections are refused,
// naming every kind.
func TestStoreKindSelected(t *testing.T) {
	t.Setenv("IDEMPROXY_TEST_PG_DSN", "postgres://proxy@db/idem")
	for _, tc := range []struct{ store, want string }{
		{"", StoreBadger},
		{"store: {epoch_check_interval: 5s}\n", StoreBadger},
		{"store: {badger: {dir: /d}}\n", StoreBadger},
		{"store: {redis: {addrs: [\"r:6379\"]}}\n", StoreRedis},
		{"store: {postgres: {dsn_env: IDEMPROXY_TEST_PG_DSN}}\n", StorePostgres},
	} {
		c := mustParse(t, tc.store+withRoute(""))
		if got := c.Store.Kind(); got != tc.want {
			t.Errorf("%q selects kind %q; want %q", tc.store, got, tc.want)
		}
		if got := len(c.Store.kindsSet()); got != 1 {
			t.Errorf("%q loads with %d store sections; want 1", tc.store, got)
		}
	}
	probs := problemsOf(t, "store:\n  redis: {addrs: [\"r:6379\"]}\n  postgres: {dsn_env: IDEMPROXY_TEST_PG_DSN}\n"+withRoute(""))
	if want := "store: set exactly one of badger, redis and postgres (line 1)"; !slices.Contains(probs, want) {
		t.Errorf("redis and postgres together: problems %q; want %q", probs, want)
	}
}
