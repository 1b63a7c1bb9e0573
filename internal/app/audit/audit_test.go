package audit

import (
	"os/user"
	"testing"
)

func TestOperator(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatalf("user.Current: %v", err)
	}
	for _, tc := range []struct {
		user, want string
	}{
		{"alice", "alice"},
		{"", me.Username}, // a container's shell often has no $USER
	} {
		got := Operator(func(k string) string {
			if k == "USER" {
				return tc.user
			}
			return ""
		})
		if got != tc.want {
			t.Errorf("Operator with USER=%q = %q, want %q", tc.user, got, tc.want)
		}
	}
}
