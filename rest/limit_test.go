package rest_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// A spent policy named like one of the pacer's own limits on principals
// ("share", "turn") is a spent budget of the key: its refusal is
// rateLimited, not the principal's shareSpent.
func TestPolicyNamedLikeAShareIsABudget(t *testing.T) {
	for _, name := range []string{"share", "turn"} {
		t.Run(name, func(t *testing.T) {
			keys := testkit.Keys(testkit.Key{Name: "demo", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", Profile: "ietf",
				MaxRate: 1000, Policies: []testkit.Policy{{Name: name, Quota: 1, Window: time.Minute}}},
				testkit.Key{Name: "other", BaseURL: "%[1]s", SecretEnv: "UPSTREAM_SECRET"})
			s := newStack(t, stackConfig{Keys: keys})
			if resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil); resp.StatusCode != 200 {
				t.Fatalf("the first call: %d %s", resp.StatusCode, body)
			}
			resp, body := s.do(t, "GET", "/k/demo/v1/participants?limit=1", syncToken, nil)
			p := checkProblem(t, resp, body, 429, "rateLimited")
			if !strings.Contains(p.Detail, "policy '"+name+"'") {
				t.Errorf("detail %q does not name policy %q", p.Detail, name)
			}
		})
	}
}
