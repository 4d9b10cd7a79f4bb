package testkit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// What Config writes is what keystore.Parse reads back: each field set
// lands in the key or caller it names, and a zero field leaves the
// default.
func TestConfigParses(t *testing.T) {
	c := testkit.Config{
		State: "/srv/quota/state.db", StateTimeout: 10 * time.Second,
		Keys: []testkit.Key{{
			Name: "demo", BaseURL: "%[1]s/api/", SecretEnv: "UPSTREAM_SECRET", Auth: "query:api_key", Profile: "ietf",
			AllowHosts: []string{"cdn.example"}, MaxRate: 1000, MaxConcurrency: 3,
			Policies: []testkit.Policy{{Name: "default", Quota: 120, Window: time.Minute}, {Name: "fast", Quota: 5, Window: 100 * time.Millisecond}},
			Reserve:  []testkit.Reserve{{Caller: "agent", Share: 0.2}},
			Shares:   []testkit.Share{{Principal: "*", Share: 0.4}, {Principal: "sync", Share: 0.8}},
		}, {
			Name: "other", BaseURL: "%[1]s", Auth: "none", Policies: testkit.Window(10, 2*time.Second),
		}},
		Callers: []testkit.Caller{{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{"demo", "other"}}},
	}
	text := fmt.Sprintf(c.TOML(), "http://127.0.0.1:9")
	env := map[string]string{"UPSTREAM_SECRET": "upstream-secret-0123456789", "AGENT_TOKEN": "agent-token-0123456789abcdef"}
	store, err := keystore.Parse([]byte(text), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatalf("keystore.Parse: %v\n%s", err, text)
	}
	if store.State() != "/srv/quota/state.db" || store.StateTimeout() != 10*time.Second {
		t.Errorf("state %q, state_timeout %v; want /srv/quota/state.db, 10s", store.State(), store.StateTimeout())
	}
	demo, err := store.Key("demo")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := demo.BaseURL.String(), "http://127.0.0.1:9/api/"; got != want {
		t.Errorf("base URL %q, want %q", got, want)
	}
	if got, want := demo.Auth, (keystore.Auth{Kind: keystore.AuthQuery, Name: "api_key"}); got != want {
		t.Errorf("auth %+v, want %+v", got, want)
	}
	if demo.MaxRate != 1000 || demo.MaxConcurrency != 3 {
		t.Errorf("max_rate %v, max_concurrency %v, want 1000, 3", demo.MaxRate, demo.MaxConcurrency)
	}
	if diff := cmp.Diff(demo.AllowHosts, []string{"cdn.example"}); diff != "" {
		t.Errorf("allow_hosts (-got +want):\n%s", diff)
	}
	wantPolicies := []keystore.Policy{
		{Name: "default", Quota: 120, Window: time.Minute, Unit: ratelimit.Requests},
		{Name: "fast", Quota: 5, Window: 100 * time.Millisecond, Unit: ratelimit.Requests},
	}
	if diff := cmp.Diff(demo.Policies, wantPolicies); diff != "" {
		t.Errorf("demo's policies (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(demo.Reserves, []keystore.Reserve{{Caller: "agent", Share: 0.2}}); diff != "" {
		t.Errorf("demo's reserve (-got +want):\n%s", diff)
	}
	if diff := cmp.Diff(demo.Shares, []keystore.Share{{Principal: "*", Share: 0.4}, {Principal: "sync", Share: 0.8}}); diff != "" {
		t.Errorf("demo's shares (-got +want):\n%s", diff)
	}
	other, err := store.Key("other")
	if err != nil {
		t.Fatal(err)
	}
	// A zero field leaves the default: the same key written by hand
	// without those lines parses to the same values.
	byHand, err := keystore.Parse([]byte(`
[[keys]]
name = "other"
base_url = "http://127.0.0.1:9"
auth = "none"
  [[keys.policies]]
  quota = 10
  window = "2s"
`), keystore.Env{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := byHand.Key("other")
	if other.Auth != want.Auth || other.MaxRate != want.MaxRate || other.MaxConcurrency != want.MaxConcurrency || other.LowWater != want.LowWater {
		t.Errorf("other: auth %v, max_rate %v, max_concurrency %v, low_water %v; by hand %v, %v, %v, %v",
			other.Auth, other.MaxRate, other.MaxConcurrency, other.LowWater, want.Auth, want.MaxRate, want.MaxConcurrency, want.LowWater)
	}
	if diff := cmp.Diff(other.Policies, want.Policies); diff != "" {
		t.Errorf("other's policies (-got +want):\n%s", diff)
	}
	agent, ok := store.Authenticate(env["AGENT_TOKEN"])
	if !ok {
		t.Fatal("the agent's token does not authenticate")
	}
	if diff := cmp.Diff(agent.Keys, []string{"demo", "other"}); agent.Name != "agent" || diff != "" {
		t.Errorf("caller %q with keys (-got +want):\n%s", agent.Name, diff)
	}
}
