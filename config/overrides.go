package config

import (
	"fmt"
	"os"
	"strings"
)

// The environment variables that override the file's listen,
// admin.listen and upstream (a flag overrides its variable in turn).
const (
	ListenEnv      = "IDEMPROXY_LISTEN"
	AdminListenEnv = "IDEMPROXY_ADMIN_LISTEN"
	UpstreamEnv    = "IDEMPROXY_UPSTREAM"
)

// Override is one setting given outside the file: its value and where it
// came from ("-listen", "$IDEMPROXY_LISTEN"); an empty Value overrides
// nothing.
type Override struct {
	Value string
	From  string
}

// Overrides are the settings given by flag or environment variable that
// take the place of the file's, at start, for -check and on every
// reload: a flag before its variable, the variable before the file.
type Overrides struct {
	Listen      Override // listen
	AdminListen Override // admin.listen
	Upstream    Override // upstream
}

// OverridesOf returns the overrides of the flags -listen, -admin-listen
// and -upstream (empty when not given) and of their variables.
func OverridesOf(listen, adminListen, upstream string, getenv func(string) string) Overrides {
	pick := func(flagValue, flagName, env string) Override {
		if flagValue != "" {
			return Override{Value: flagValue, From: "-" + flagName}
		}
		if v := getenv(env); v != "" {
			return Override{Value: v, From: "$" + env}
		}
		return Override{}
	}
	return Overrides{
		Listen:      pick(listen, "listen", ListenEnv),
		AdminListen: pick(adminListen, "admin-listen", AdminListenEnv),
		Upstream:    pick(upstream, "upstream", UpstreamEnv),
	}
}

// fields pairs each override with the field it replaces.
func (o Overrides) fields(c *Config) []struct {
	name string
	o    Override
	dst  *string
} {
	return []struct {
		name string
		o    Override
		dst  *string
	}{
		{"listen", o.Listen, &c.Listen},
		{"admin.listen", o.AdminListen, &c.Admin.Listen},
		{"upstream", o.Upstream, &c.Upstream},
	}
}

// apply sets the overridden fields of c.
func (o Overrides) apply(c *Config) {
	for _, f := range o.fields(c) {
		if f.o.Value != "" {
			*f.dst = f.o.Value
		}
	}
}

// name returns the name a validation problem gives the field that starts
// problem when it was overridden ("listen (from -listen)"), so that the
// problem names where the value came from and no line of the file.
func (o Overrides) name(problem string) (string, bool) {
	for _, f := range o.fields(&Config{}) {
		if f.o.Value != "" && strings.HasPrefix(problem, f.name+": ") {
			return f.name + " (from " + f.o.From + ")" + strings.TrimPrefix(problem, f.name), true
		}
	}
	return problem, false
}

// Sources returns, for the start log, where listen, admin.listen and
// upstream came from: the flag, the variable or the file.
func (o Overrides) Sources() []any {
	from := func(ov Override) string {
		if ov.Value == "" {
			return "file"
		}
		return ov.From
	}
	return []any{"listen_from", from(o.Listen), "admin_listen_from", from(o.AdminListen), "upstream_from", from(o.Upstream)}
}

// Given lists the overrides set, as "listen=127.0.0.1:18080 (-listen)",
// for -check's answer.
func (o Overrides) Given() []string {
	var given []string
	for _, f := range o.fields(&Config{}) {
		if f.o.Value != "" {
			given = append(given, fmt.Sprintf("%s=%s (%s)", f.name, redactedURL(f.o.Value), f.o.From))
		}
	}
	return given
}

// LoadWith reads, defaults and validates the configuration file at path
// with the overrides in place of the file's values, as Load does without.
func LoadWith(path string, o Overrides) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(b, o)
}
