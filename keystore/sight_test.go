package keystore

import (
	"errors"
	"strings"
	"testing"
)

// sightConfig: alice and bob are people; nightly-sync (an OAuth job) is
// visible to alice and to group ops; the static caller "etl" to bob;
// carol is an administrator without a principal of her own.
const sightConfig = oauthKeys + `
[[keys]]
name = "ops"
base_url = "https://ops.example.com"
auth = "none"

[[callers]]
name = "etl"
token_env = "ETL_TOKEN"
keys = ["other"]
visible_to = ["bob@example.com"]

[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
admin_group = "admins"
name_claim = "email"

[[principals]]
name = "alice@example.com"
claim = "email"
values = ["alice@example.com"]
keys = ["gh"]

[[principals]]
name = "bob@example.com"
claim = "email"
values = ["bob@example.com"]
keys = ["gh"]

[[principals]]
name = "nightly-sync"
claim = "client_id"
values = ["sync-job"]
keys = ["ops"]
visible_to = ["alice@example.com", "group:ops"]
`

func TestSight(t *testing.T) {
	s, err := Parse([]byte(sightConfig), env(map[string]string{"ETL_TOKEN": "etl-token-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		name       string
		uses, sees []string // keys
		hidden     []string // keys it neither uses nor sees
		seen       []string // activity callers it sees
		unseen     []string // activity callers it does not see
	}
	for _, tc := range []struct {
		who  string
		c    claims
		want want
	}{
		{"alice", claims{"sub": {"u1"}, "email": {"alice@example.com"}, "client_id": {"dash"}},
			want{name: "alice@example.com via dash", uses: []string{"gh"}, sees: []string{"gh", "ops"}, hidden: []string{"other"},
				seen:   []string{"alice@example.com", "alice@example.com via Claude.ai", "nightly-sync"},
				unseen: []string{"bob@example.com via dash", "etl", "alice@example.comx", "nightly-sync-2", "local"}}},
		{"bob", claims{"sub": {"u2"}, "email": {"bob@example.com"}, "client_id": {"u2"}},
			want{name: "bob@example.com", uses: []string{"gh"}, sees: []string{"gh", "other"}, hidden: []string{"ops"},
				seen: []string{"bob@example.com", "etl"}, unseen: []string{"alice@example.com", "nightly-sync"}}},
		{"bob in group ops", claims{"sub": {"u2"}, "email": {"bob@example.com"}, "groups": {"ops"}},
			want{name: "bob@example.com", uses: []string{"gh"}, sees: []string{"gh", "other", "ops"},
				seen: []string{"etl", "nightly-sync"}, unseen: []string{"alice@example.com"}}},
		{"carol, administrator", claims{"sub": {"u3"}, "email": {"carol@example.com"}, "groups": {"admins"}},
			want{name: "carol@example.com", sees: []string{"gh", "other", "ops"}, hidden: nil,
				seen: []string{"alice@example.com via dash", "etl", "nightly-sync", "local"}}},
	} {
		t.Run(tc.who, func(t *testing.T) {
			c, err := s.Principal(tc.c)
			if err != nil {
				t.Fatal(err)
			}
			if c.Name != tc.want.name {
				t.Errorf("name = %q, want %q", c.Name, tc.want.name)
			}
			for _, k := range []string{"gh", "other", "ops"} {
				if got, want := c.MayUse(k), contains(tc.want.uses, k); got != want {
					t.Errorf("MayUse(%q) = %v, want %v", k, got, want)
				}
				if got, want := c.MaySeeKey(k), contains(tc.want.sees, k); got != want {
					t.Errorf("MaySeeKey(%q) = %v, want %v", k, got, want)
				}
			}
			for _, who := range tc.want.seen {
				if !c.MaySee(who) {
					t.Errorf("MaySee(%q) = false, want true", who)
				}
			}
			for _, who := range tc.want.unseen {
				if c.MaySee(who) {
					t.Errorf("MaySee(%q) = true, want false", who)
				}
			}
		})
	}
	// With groups_claim, a group of visible_to is read from that claim, and
	// not from "groups".
	ns, err := Parse([]byte(strings.Replace(sightConfig, `name_claim = "email"`, "name_claim = \"email\"\ngroups_claim = \"https://example.com/groups\"", 1)),
		env(map[string]string{"ETL_TOKEN": "etl-token-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	for claim, sees := range map[string]bool{"https://example.com/groups": true, "groups": false} {
		c, err := ns.Principal(claims{"sub": {"u2"}, "email": {"bob@example.com"}, claim: {"ops"}})
		if err != nil || c.MaySee("nightly-sync") != sees {
			t.Errorf("bob with ops in %q: %+v, %v; want MaySee(nightly-sync) %v", claim, c, err, sees)
		}
	}
	// A [[callers]] token keeps its sight of every call of its keys.
	etl, ok := s.Authenticate("etl-token-0123456789")
	if !ok || !etl.SeesEveryone() || !etl.MaySee("alice@example.com") || etl.MaySeeKey("gh") {
		t.Errorf("etl = %+v", etl)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestSightConfigErrors(t *testing.T) {
	base := oauthKeys + `
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
`
	for name, tc := range map[string]struct{ conf, field, says string }{
		"empty group": {base + `
[[principals]]
name = "a"
values = ["a"]
keys = ["gh"]
visible_to = ["group:"]`, "principals[0].visible_to[0]", "names no group"},
		"empty viewer": {base + `
[[principals]]
name = "a"
values = ["a"]
keys = ["gh"]
visible_to = [""]`, "principals[0].visible_to[0]", "name a principal"},
		"via in a name": {base + `
[[principals]]
name = "a via b"
values = ["a"]
keys = ["gh"]`, "principals[0].name", "may not contain"},
		"dashboard secret without client": {base + `dashboard_client_secret_env = "T"
`, "oauth.dashboard_client_secret_env", "set dashboard_client_id"},
		"caller's empty group": {`
[[callers]]
name = "etl"
token_env = "T"
keys = ["gh"]
visible_to = ["group: "]
` + base, "callers[0].visible_to[0]", "names no group"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.conf), env(map[string]string{"T": "etl-token-0123456789"}))
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(ce.Msg, tc.says) {
				t.Fatalf("got %v, want %s: …%s…", err, tc.field, tc.says)
			}
		})
	}
}
