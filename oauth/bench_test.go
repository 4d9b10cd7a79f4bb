package oauth_test

import (
	"slices"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/oidctest"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/oauth"
)

// p50 reports the median of the per-call durations as p50-ns.
func p50(b *testing.B, d []time.Duration) {
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
	d := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		if _, ok := s.Authenticate("a-static-caller-token-0123456789"); !ok {
			b.Fatal("refused")
		}
		d = append(d, time.Since(t0))
	}
	p50(b, d)
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
	d := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Verify(b.Context(), tok); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	p50(b, d)
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
	d := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		if _, err := s.Verify(b.Context(), tok); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	p50(b, d)
}

func BenchmarkIntrospection(b *testing.B) {
	iss := oidctest.Start(b, 1, "alice")
	s, _, clk := newServer(b, iss, true, func(c *oauth.Config) { c.IntrospectionCache = time.Nanosecond })
	tok := oidctest.ClientCredentials(b, iss[0], "opaque-job", "opaque-job-secret", resource, "mcp")
	d := make([]time.Duration, 0, b.N)
	for b.Loop() {
		clk.Advance(time.Nanosecond) // the cached answer ends
		t0 := time.Now()
		if _, err := s.Verify(b.Context(), tok); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	p50(b, d)
}
