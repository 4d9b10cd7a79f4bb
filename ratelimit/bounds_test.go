package ratelimit

import (
	"net/http"
	"strings"
	"testing"
)

// hostileResponses returns responses whose every field Read looks at is
// about 64 KiB of the kind of text that costs a parser the most, and a
// 64 KiB body.
func hostileResponses() map[string]Response {
	const size = 64 << 10
	fill := func(unit string) string { return strings.Repeat(unit, size/len(unit)) }
	values := map[string]string{
		"digits":      fill("9"),
		"list":        fill(`"a";r=1, `),
		"params":      fill(";a"),
		"tokens":      "a" + fill(",a"),
		"dictionary":  "limit=1" + fill(", a=1"),
		"under bound": strings.Repeat(`"a";r=1, `, 63) + `"a";r=1;` + strings.Repeat("x", 7000),
		"date":        fill("Sat, 23 May 2026 12:00:30 GMT "),
	}
	fields := []string{
		"Retry-After", "Retry-After-Ms", "X-Should-Retry", "Stripe-Should-Retry", "Date", "Age", "X-From-Cache",
		"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
		"RateLimit-ResetTime", "RateLimit-Name", "RateLimit-Reason", "Beta-RateLimit", "Beta-RateLimit-Policy",
		"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Resource",
		"X-RateLimit-Reset-After", "X-RateLimit-Bucket", "X-RateLimit-Scope", "X-RateLimit-Global", "X-RateLimit-Used",
		"X-RateLimit-Limit-Requests", "X-RateLimit-Reset-Tokens", "Anthropic-Ratelimit-Tokens-Reset",
		"X-Shopify-Shop-Api-Call-Limit", "Content-Type",
	}
	bodies := map[string][]byte{
		"digits":     []byte(fill("9")),
		"list":       []byte(`{"errors":[` + fill(`{"type":"RATE_LIMITED"},`) + `{}],"status":429}`),
		"params":     []byte(`{` + fill(`"a":1,`) + `"type":"x","title":"y"}`),
		"tokens":     []byte(`{"violated-policies":[` + fill(`"a",`) + `"a"],"status":429}`),
		"dictionary": []byte(`{"extensions":{"cost":{"throttleStatus":{"maximumAvailable":[` + fill("1,") + `1]}}}}`),
	}
	out := map[string]Response{}
	for name, v := range values {
		h := http.Header{}
		for _, f := range fields {
			h.Set(f, v)
		}
		out[name] = Response{Status: 429, Header: h, Body: bodies[name]}
	}
	return out
}

// TestHostileHeadersAreBounded checks that a 64 KiB value in every field,
// under every profile, costs a bounded number of allocations: fields over
// the size bounds are refused before they are parsed, and the worst case
// ("under bound": a field just inside the bounds, parsed in full, under
// Jira, which parses the most fields) stays within a few thousand.
func TestHostileHeadersAreBounded(t *testing.T) {
	const maxAllocs = 6000
	for name, resp := range hostileResponses() {
		for _, p := range Profiles() {
			var r Reading
			allocs := testing.AllocsPerRun(3, func() { r = read(p, resp, defaultNow) })
			checkInvariants(t, r)
			if allocs > maxAllocs {
				t.Errorf("%s under %s: %.0f allocations, want at most %d", name, p, allocs, maxAllocs)
			}
		}
	}
}

// TestManyFieldLines checks that thousands of field lines are bounded too.
func TestManyFieldLines(t *testing.T) {
	h := http.Header{}
	for i := 0; i < 10000; i++ {
		h.Add("Ratelimit", `"a";r=1`)
		h.Add("Retry-After", "1")
		h.Add("X-Ratelimit-Remaining", "1")
	}
	allocs := testing.AllocsPerRun(3, func() { read(Generic, Response{Status: 429, Header: h}, defaultNow) })
	if allocs > 200 {
		t.Errorf("%.0f allocations for 10000 field lines, want at most 200", allocs)
	}
}

func BenchmarkRead(b *testing.B) {
	seed := Response{Status: 200, Header: http.Header{
		"Date":                  {"Sat, 23 May 2026 12:00:00 GMT"},
		"Ratelimit-Policy":      {`"default";q=120;w=60`},
		"Ratelimit":             {`"default";r=117;t=42`},
		"X-Ratelimit-Limit":     {"120"},
		"X-Ratelimit-Remaining": {"117"},
		"X-Ratelimit-Reset":     {"42"},
	}}
	b.Run("seed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Read(IETF, seed, defaultNow)
		}
	})
	for name, resp := range hostileResponses() {
		b.Run("hostile-"+strings.ReplaceAll(name, " ", "-"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Read(GitHub, resp, defaultNow)
			}
		})
	}
}
