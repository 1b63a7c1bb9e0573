package config

import "strings"

// The kinds of store: each is the name of its section of store, and the
// backend's name in metrics, logs and internal/app's registry of backends.
const (
	StoreBadger   = "badger"
	StoreRedis    = "redis"
	StorePostgres = "postgres"
)

// storeKinds is the configuration's side of the table of store backends
// (the program's side is internal/app's registry): each kind with its
// section of Store, in the order messages list them. The section's type
// says its defaults (applyDefaults, in defaults.go) and its checks
// (validate, in validate.go); defaultStore is the kind used when none is
// set. A new backend adds its section to Store and one line here.
var storeKinds = []storeKind{
	kind(StoreBadger, func(s *Store) **Badger { return &s.Badger }),
	kind(StoreRedis, func(s *Store) **Redis { return &s.Redis }),
	kind(StorePostgres, func(s *Store) **Postgres { return &s.Postgres }),
}

// A storeSection is a kind's section of store.
type storeSection interface {
	// applyDefaults fills the section's unset fields.
	applyDefaults()
	// validate adds the problems of the defaulted section to p, each
	// naming its field (store.<kind>.<field>).
	validate(p *problems)
}

// A storeKind is one kind of store and its section of Store.
type storeKind struct {
	name string
	// section returns the kind's section of s, nil when it is not set.
	section func(s *Store) storeSection
	// add sets the kind's section of s to an empty one.
	add func(s *Store)
}

// kind returns the storeKind called name whose section is the field of
// Store that field points to.
func kind[T any, P interface {
	*T
	storeSection
}](name string, field func(s *Store) *P) storeKind {
	return storeKind{
		name: name,
		section: func(s *Store) storeSection {
			if p := *field(s); p != nil {
				return p
			}
			return nil // not a nil *T in an interface
		},
		add: func(s *Store) { *field(s) = new(T) },
	}
}

// StoreKinds returns the name of every kind of store, which is also its
// section of store, in the order messages list them.
func StoreKinds() []string {
	names := make([]string, len(storeKinds))
	for i, k := range storeKinds {
		names[i] = k.name
	}
	return names
}

// Kind returns the kind of store s selects: the name of the one section it
// sets. It is "" when none is set (applying the defaults selects
// defaultStore); when several are, which Validate refuses, it is the first
// of them in StoreKinds' order.
func (s Store) Kind() string {
	if set := s.kindsSet(); len(set) > 0 {
		return set[0].name
	}
	return ""
}

// kindsSet returns the kinds whose section s sets, in storeKinds' order.
func (s *Store) kindsSet() []storeKind {
	var set []storeKind
	for _, k := range storeKinds {
		if k.section(s) != nil {
			set = append(set, k)
		}
	}
	return set
}

// sayList joins names as a sentence does: "a, b and c".
func sayList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
