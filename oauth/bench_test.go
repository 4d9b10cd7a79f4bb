package oauth_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/oidctest"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/oauth"
)

// timeEach runs call b.N times, each after prepare (when not nil, and
// not timed), and reports the median call's duration as p50-ns; a call
// that fails fails b.
func timeEach(b *testing.B, prepare func(), call func() error) {
	d := make([]time.Duration, 0, b.N)
	for b.Loop() {
		if prepare != nil {
			prepare()
		}
		t0 := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
}

// BenchmarkStaticToken is the check a static caller token costs: the
// baseline the OAuth checks add to.
func BenchmarkStaticToken(b *testing.B) {
	s, err := keystore.Parse([]byte(`[[callers]]
name = "agent"
token_env = "T"
keys = ["*"]
`), keystore.Env{Getenv: func(string) string { return "a-static-caller-token-0123456789" }})
	if err != nil {
		b.Fatal(err)
	}
	timeEach(b, nil, func() error {
		if _, ok := s.Authenticate("a-static-caller-token-0123456789"); !ok {
			return errors.New("refused")
		}
		return nil
	})
}

// BenchmarkJWT is the check of a JWT access token from oidc-provider
// (RS256, 2048-bit key), the issuer's keys already fetched.
func BenchmarkJWT(b *testing.B) {
	iss := oidctest.Start(b, 1, "alice")
	s, _, _ := newServer(b, iss, false)
	tok := oidctest.ClientCredentials(b, iss[0], "sync-job", "sync-job-secret", resource, "mcp")
	if _, err := s.Verify(b.Context(), tok); err != nil {
		b.Fatal(err)
	}
	timeEach(b, nil, func() error { _, err := s.Verify(b.Context(), tok); return err })
}

// BenchmarkIntrospectionCached is the check of an opaque token whose
// introspection is in the cache; BenchmarkIntrospection (the cache
// emptied each call by the clock) asks the issuer every time.
func BenchmarkIntrospectionCached(b *testing.B) {
	iss := oidctest.Start(b, 1, "alice")
	s, _, _ := newServer(b, iss, true)
	tok := oidctest.ClientCredentials(b, iss[0], "opaque-job", "opaque-job-secret", resource, "mcp")
	if _, err := s.Verify(b.Context(), tok); err != nil {
		b.Fatal(err)
	}
	timeEach(b, nil, func() error { _, err := s.Verify(b.Context(), tok); return err })
}

func BenchmarkIntrospection(b *testing.B) {
	iss := oidctest.Start(b, 1, "alice")
	s, _, clk := newServer(b, iss, true, func(c *oauth.Config) { c.IntrospectionCache = time.Nanosecond })
	tok := oidctest.ClientCredentials(b, iss[0], "opaque-job", "opaque-job-secret", resource, "mcp")
	timeEach(b, func() { clk.Advance(time.Nanosecond) }, // the cached answer ends
		func() error { _, err := s.Verify(b.Context(), tok); return err })
}
