// Package audit holds what the audit log's command-line side shares: the
// commands that release keys, reconcile them or accept a store's loss
// default their -operator flag to Operator.
package audit

import "os/user"

// Operator returns the operator a command names when -operator is not
// given: $USER (getenv's), else the OS account running the command, else
// "" (the audit line then leaves operator out).
func Operator(getenv func(string) string) string {
	if u := getenv("USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}
