package keystore

import (
	"errors"
	"strings"
	"testing"
)

const oauthKeys = `[[keys]]
name = "gh"
base_url = "https://api.github.com"
auth = "none"
scopes = ["gh"]
write_scopes = ["gh:write"]

[[keys]]
name = "other"
base_url = "https://api.example.com"
auth = "none"
`

// claims are a token's claims for the principal rules.
type claims map[string][]string

func (c claims) Values(name string) []string { return c[name] }

func TestOAuthConfig(t *testing.T) {
	s, err := Parse([]byte(oauthKeys+`
[oauth]
issuer = "https://idp.example.com/realms/team"
issuers = ["https://login.example.org"]
resource = "https://mcp.example.com/mcp"
scopes = ["mcp"]
introspection_client_id = "mcp-quota"
introspection_secret_env = "INTRO"
clients = { "abc123" = "Claude.ai" }

[[principals]]
name = "alice@example.com"
claim = "email"
values = ["alice@example.com"]
keys = ["gh"]

[[principals]]
name = "team-a"
claim = "groups"
values = ["team-a"]
keys = ["*"]
`), env(map[string]string{"INTRO": "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	o := s.OAuth()
	if o == nil || len(o.Issuers) != 2 || o.IntrospectionSecret.Reveal() != "s3cret" || o.NameClaim != "sub" {
		t.Fatalf("oauth = %+v", o)
	}
	gh, _ := s.Key("gh")
	if got := strings.Join(s.NeedScopes(gh, "POST"), " "); got != "gh gh:write mcp" {
		t.Errorf("POST on gh needs %q", got)
	}
	if got := strings.Join(s.NeedScopes(gh, "GET"), " "); got != "gh mcp" {
		t.Errorf("GET on gh needs %q", got)
	}
	c, err := s.Principal(claims{"sub": {"u1"}, "email": {"alice@example.com"}, "client_id": {"abc123"}})
	if err != nil || c.Name != "alice@example.com via Claude.ai" || !c.MayUse("gh") || c.MayUse("other") || !c.OAuth {
		t.Errorf("alice = %+v, %v", c, err)
	}
	c, err = s.Principal(claims{"sub": {"u2"}, "groups": {"x", "team-a"}, "client_id": {"zzz"}})
	if err != nil || c.Name != "team-a via zzz" || !c.MayUse("other") {
		t.Errorf("team-a = %+v, %v", c, err)
	}
	c, err = s.Principal(claims{"sub": {"job"}, "client_id": {"job"}, "groups": {"team-a"}})
	if err != nil || c.Name != "team-a" {
		t.Errorf("a client-credentials job = %+v, %v", c, err)
	}
	_, err = s.Principal(claims{"sub": {"u3"}, "email": {"carol@example.com"}})
	if !errors.Is(err, ErrUnknownPrincipal) || !strings.Contains(err.Error(), "carol@example.com") || !strings.Contains(err.Error(), "[[principals]]") {
		t.Errorf("unknown principal: %v", err)
	}
}

// withDefaultKeys parses oauthKeys with an [oauth] table that gives
// unlisted principals the key other, names them by email, and has an
// admin group; extra adds lines to the table.
func withDefaultKeys(t *testing.T, extra string) *Store {
	t.Helper()
	s, err := Parse([]byte(oauthKeys+`
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
name_claim = "email"
default_keys = ["other"]
admin_group = "admins"
`+extra), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOAuthDefaultKeys(t *testing.T) {
	s := withDefaultKeys(t, "")
	c, err := s.Principal(claims{"sub": {"u3"}, "email": {"carol@example.com"}})
	if err != nil || c.Name != "carol@example.com" || !c.MayUse("other") || c.MayUse("gh") {
		t.Errorf("default principal = %+v, %v", c, err)
	}
	// An administrator sees every key and every call, but uses only the
	// keys its principal is given (here the default keys).
	c, err = s.Principal(claims{"sub": {"u4"}, "email": {"dan@example.com"}, "groups": {"admins"}})
	if err != nil || c.Name != "dan@example.com" || c.MayUse("gh") || !c.MayUse("other") || !c.MaySeeKey("gh") || !c.MaySee("anyone via anything") {
		t.Errorf("an administrator = %+v, %v", c, err)
	}
}

// TestOAuthGroupsClaim: an issuer that puts groups in a claim of its own
// (Auth0's namespaced claims) names it with groups_claim, and admin_group
// reads it there, not in "groups".
func TestOAuthGroupsClaim(t *testing.T) {
	s := withDefaultKeys(t, "groups_claim = \"https://example.com/groups\"\n")
	c, err := s.Principal(claims{"sub": {"u4"}, "email": {"dan@example.com"}, "https://example.com/groups": {"admins"}})
	if err != nil || !c.MaySee("anyone via anything") {
		t.Errorf("an administrator by the namespaced claim = %+v, %v; want one who sees every call", c, err)
	}
	c, err = s.Principal(claims{"sub": {"u5"}, "email": {"eve@example.com"}, "groups": {"admins"}})
	if err != nil || c.MaySee("anyone via anything") {
		t.Errorf("admins in the plain groups claim = %+v, %v; want no administrator", c, err)
	}
}

func TestOAuthConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct{ conf, field, says string }{
		"no oauth": {`
[[principals]]
name = "a"
values = ["a"]
keys = ["gh"]`, "principals", "add an [oauth] table"},
		"no issuer": {`
[oauth]
resource = "https://mcp.example.com/mcp"`, "oauth.issuer", "name the authorization server"},
		"hmac": {`
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
algorithms = ["HS256"]`, "oauth.algorithms[0]", "HMAC"},
		"none": {`
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
algorithms = ["none"]`, "oauth.algorithms[0]", "never are"},
		"bad resource": {`
[oauth]
issuer = "https://idp.example.com"
resource = "mcp.example.com"`, "oauth.resource", "canonical URI"},
		"unknown key": {`
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
[[principals]]
name = "a"
values = ["a"]
keys = ["nope"]`, "principals[0].keys[0]", `key "nope" is not configured`},
		"scope with a quote": {`
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
scopes = ["a\"b"]`, "oauth.scopes[0]", "not a scope"},
		"introspection without secret": {`
[oauth]
issuer = "https://idp.example.com"
resource = "https://mcp.example.com/mcp"
introspection_client_id = "mcp-quota"`, "oauth.introspection_client_id", "client secret"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(oauthKeys+tc.conf), env(nil))
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(ce.Msg, tc.says) {
				t.Fatalf("got %v, want %s: …%s…", err, tc.field, tc.says)
			}
		})
	}
}
