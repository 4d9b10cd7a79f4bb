package testkit_test

import (
	"fmt"
	"strings"
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

// claims is a token's claims, for keystore's Principal.
type claims map[string][]string

func (c claims) Values(claim string) []string { return c[claim] }

// The [oauth] table and the principals Config writes are what
// keystore.Parse reads back.
func TestConfigParsesOAuth(t *testing.T) {
	c := testkit.Config{
		Keys: []testkit.Key{{Name: "demo", BaseURL: "http://127.0.0.1:9/", Auth: "none"}, {Name: "ops", BaseURL: "http://127.0.0.1:9/", Auth: "none"}},
		OAuth: &testkit.OAuth{Issuer: "https://idp.example", Resource: "http://127.0.0.1:8787/mcp", Scopes: []string{"mcp"},
			IntrospectionClientID: "mcp-quota", IntrospectionSecretEnv: "INTROSPECTION_SECRET", Contact: "the platform team",
			DashboardClientID: "dash", IssuerName: "Test IdP", AdminGroup: "team-a"},
		Principals: []testkit.Principal{
			{Name: "alice@example.com", Claim: "email", Values: []string{"alice@example.com"}, Keys: []string{"demo"}},
			{Name: "nightly-sync", Claim: "client_id", Values: []string{"sync-job"}, Keys: []string{"demo", "ops"}, VisibleTo: []string{"alice@example.com"}},
		},
	}
	env := map[string]string{"INTROSPECTION_SECRET": "introspection-secret-0123456789"}
	store, err := keystore.Parse([]byte(c.TOML()), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatalf("keystore.Parse: %v\n%s", err, c.TOML())
	}
	o := store.OAuth()
	if o == nil {
		t.Fatalf("no [oauth] table read from:\n%s", c.TOML())
	}
	got := []any{o.Issuers, o.Resource, o.Scopes, o.IntrospectionClient, o.Contact, o.DashboardClient, o.IssuerName, o.AdminGroup}
	want := []any{[]string{"https://idp.example"}, "http://127.0.0.1:8787/mcp", []string{"mcp"}, "mcp-quota", "the platform team", "dash", "Test IdP", "team-a"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("[oauth] (-want +got):\n%s", diff)
	}
	sync, err := store.Principal(claims{"client_id": {"sync-job"}})
	if err != nil || sync.Name != "nightly-sync" || !sync.MayUse("ops") {
		t.Errorf("the job's principal: %+v, %v; want nightly-sync, which may use ops", sync, err)
	}
	alice, err := store.Principal(claims{"email": {"alice@example.com"}})
	if err != nil || alice.Name != "alice@example.com" || alice.MayUse("ops") {
		t.Errorf("alice's principal: %+v, %v; want alice@example.com, who may not use ops", alice, err)
	}
	if plain := testkit.Keys(c.Keys...); strings.Contains(plain, "oauth") || strings.Contains(plain, "principals") {
		t.Errorf("a configuration without OAuth has an [oauth] table or principals:\n%s", plain)
	}
}
