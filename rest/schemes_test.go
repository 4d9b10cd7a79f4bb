package rest_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/gateway"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// The caller token is accepted in the schemes vendor SDKs send by
// default (GitHub's "token", Discord's "Bot"), and a bad guess in any of
// them counts towards the bad-token throttle as a Bearer one does: the
// 21st bad guess from one address is throttled, in whatever scheme.
func TestCallerTokenSchemes(t *testing.T) {
	start := time.Now()
	clk := testkit.NewClock(start)
	s := newStack(t, stackConfig{Gateway: func(c *gateway.Config) { c.Clock = clk }})
	for _, scheme := range []string{"Bearer", "token", "TOKEN", "Bot"} {
		resp, body := s.do(t, "GET", "/v1/quota", "", nil, "Authorization", scheme+" "+syncToken)
		if resp.StatusCode != 200 {
			t.Errorf("Authorization: %s <token>: %d %s, want 200", scheme, resp.StatusCode, body)
		}
	}
	for _, scheme := range []string{"Basic", "Token-x"} {
		resp, body := s.do(t, "GET", "/v1/quota", "", nil, "Authorization", scheme+" "+syncToken)
		checkProblem(t, resp, body, 401, "unauthorized")
	}
	schemes := []string{"token", "Bot", "Bearer"}
	for i := range 18 {
		resp, body := s.do(t, "GET", "/v1/quota", "", nil, "Authorization", fmt.Sprintf("%s guess-%02d", schemes[i%3], i))
		checkProblem(t, resp, body, 401, "unauthorized")
	}
	resp, body := s.do(t, "GET", "/v1/quota", "", nil, "Authorization", "token guess-20")
	checkProblem(t, resp, body, 429, "rateLimited")
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 1 {
		t.Errorf("Retry-After %q, want a wait", resp.Header.Get("Retry-After"))
	}
}
