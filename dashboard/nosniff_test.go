package dashboard_test

import (
	"strings"
	"testing"
)

// TestEveryAnswerNosniff: every answer of the HTTP side — JSON, problems
// from each wall, the MCP side's, the page's, the metrics — carries
// X-Content-Type-Options: nosniff.
func TestEveryAnswerNosniff(t *testing.T) {
	base, _ := server(t, true)
	c := browser(t)
	auth := []string{"Authorization", "Bearer " + tokenB}
	for _, tt := range []struct {
		method, path string
		header       []string
	}{
		{"GET", "/healthz", nil},
		{"GET", "/v1/quota", auth},
		{"GET", "/v1/quota?key=nope", auth},
		{"GET", "/v1/activity?key=k", auth},
		{"GET", "/v1/quota", nil},                                                             // 401
		{"GET", "/v1/quota", []string{"Authorization", "Bearer wrong"}},                       // 401
		{"GET", "/v1/quota", append([]string{"Origin", "https://evil.example"}, auth...)},     // 403
		{"GET", "/v1/quota", append([]string{"X-Big", strings.Repeat("x", 40<<10)}, auth...)}, // 431
		{"GET", "/nothing", auth},
		{"GET", "/k/nope/x", auth},
		{"GET", "/metrics", auth},
		{"GET", "/ui/api/overview", auth},
		{"GET", "/ui/api/call?key=nope&call=1", auth},
		{"GET", "/", nil},
		{"POST", "/mcp", append([]string{"Mcp-Session-Id", "no-such-session"}, auth...)},
	} {
		resp, _ := do(t, c, tt.method, base+tt.path, tt.header...)
		if got := resp.Header.Values("X-Content-Type-Options"); len(got) != 1 || got[0] != "nosniff" {
			t.Errorf("%s %s: %d %s, X-Content-Type-Options %q; want nosniff", tt.method, tt.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), got)
		}
	}
}
