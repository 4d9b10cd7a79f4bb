package main

import (
	"context"
	"strings"
	"testing"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

type fakeDB struct{}

func (fakeDB) Check(context.Context) error { return nil }

type fakePG struct{ fakeDB }

func (fakePG) Where() string { return "db.example:5432/quota" }

// TestWithDetailKeepsWhere: /healthz still knows a database state for
// one, once the reloads' detail wraps it.
func TestWithDetailKeepsWhere(t *testing.T) {
	r := &reloader{keys: &keystore.Store{}}
	if _, ok := withDetail(fakePG{}, r).(interface{ Where() string }); !ok {
		t.Error("a database state lost its Where")
	}
	if _, ok := withDetail(fakeDB{}, r).(interface{ Where() string }); ok {
		t.Error("a state file gained a Where")
	}
}

// TestRestartOnly: a reload that changes what only a restart changes is
// refused, saying which.
func TestRestartOnly(t *testing.T) {
	parse := func(extra string) *keystore.Store {
		key := testkit.Keys(testkit.Key{Name: "a", BaseURL: "https://api.example.com", Auth: "none"})
		s, err := keystore.Parse([]byte(extra+"\n"+key), keystore.Env{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := parse(`state = "/srv/q/state.db"`)
	for _, tc := range []struct{ extra, want string }{
		{`state = "/srv/q/state.db"`, ""},
		{`state = "/srv/other.db"`, "state"},
		{"state = \"/srv/q/state.db\"\nbody_memory_mib = 128", "body_memory_mib"},
		{"state = \"/srv/q/state.db\"\ntls_cert = \"/srv/q/tls.crt\"\ntls_key = \"/srv/q/tls.key\"", "tls_cert"},
	} {
		err := restartOnly(base, parse(tc.extra))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want it taken", tc.extra, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want a refusal naming %s", tc.extra, err, tc.want)
		}
	}
}
