package keystore

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// oauthConfig is the [oauth] table's shape.
type oauthConfig struct {
	Issuer                  string            `toml:"issuer"`
	Issuers                 []string          `toml:"issuers"`
	Resource                string            `toml:"resource"`
	Audience                string            `toml:"audience"`
	Scopes                  []string          `toml:"scopes"`
	Algorithms              []string          `toml:"algorithms"`
	Skew                    duration          `toml:"skew"`
	IntrospectionClientID   string            `toml:"introspection_client_id"`
	IntrospectionSecretEnv  string            `toml:"introspection_secret_env"`
	IntrospectionSecretFile string            `toml:"introspection_secret_file"`
	IntrospectionCache      duration          `toml:"introspection_cache"`
	NameClaim               string            `toml:"name_claim"`
	DefaultKeys             []string          `toml:"default_keys"`
	Contact                 string            `toml:"contact"`
	Clients                 map[string]string `toml:"clients"`
	AdminGroup              string            `toml:"admin_group"`
	GroupsClaim             string            `toml:"groups_claim"`
	DashboardClientID       string            `toml:"dashboard_client_id"`
	DashboardSecretEnv      string            `toml:"dashboard_client_secret_env"`
	IssuerName              string            `toml:"issuer_name"`
}

// principalConfig is a [[principals]] entry.
type principalConfig struct {
	Name   string   `toml:"name"`
	Claim  string   `toml:"claim"`
	Values []string `toml:"values"`
	Keys   []string `toml:"keys"`
	// VisibleTo are the principals and groups ("group:ops") that see
	// this principal's calls on the dashboard.
	VisibleTo []string `toml:"visible_to"`
}

// OAuth is the [oauth] table: mcp-quota as an OAuth resource server.
type OAuth struct {
	Issuers             []string
	Resource            string
	Audience            string   // the aud tokens carry; empty means Resource
	Scopes              []string // every token needs them
	Algorithms          []string // nil: the default allow-list
	Skew                time.Duration
	IntrospectionClient string
	IntrospectionSecret Secret
	IntrospectionCache  time.Duration
	// NameClaim names a principal the config does not list (one given
	// DefaultKeys); "sub" when not set.
	NameClaim string
	// DefaultKeys are the keys of a principal no [[principals]] entry
	// matches; none means such a principal is refused.
	DefaultKeys []string
	// Contact is who to ask for access, named in the refusal.
	Contact string
	// Clients names OAuth clients by client_id ("Claude.ai").
	Clients map[string]string
	// AdminGroup is the group (of GroupsClaim) whose members see every
	// principal's calls on every key; they use only the keys their own
	// principal is given.
	AdminGroup string
	// GroupsClaim is the claim that holds a token's groups, for
	// AdminGroup and visible_to's "group:…"; "groups" when not set (an
	// issuer that namespaces its claims, as Auth0 does, names its own).
	GroupsClaim string
	// DashboardClient (and DashboardSecret, for a confidential client)
	// is the dashboard's client at the authorization server; empty, the
	// dashboard registers one there itself (RFC 7591) when it can.
	DashboardClient string
	DashboardSecret Secret
	// IssuerName is the first issuer as people know it ("Example SSO"),
	// on the dashboard's sign-in button; empty means its host.
	IssuerName string
}

// A PrincipalRule maps token claims to a principal: a token whose Claim
// has one of Values is the principal Name and may use Keys.
type PrincipalRule struct {
	Name   string
	Claim  string
	Values []string
	Keys   []string
	// VisibleTo are the principals (by name) and groups ("group:" and a
	// value of the groups claim) that see this principal's calls.
	VisibleTo []string
}

// OAuth returns the [oauth] table, or nil when the configuration has
// none (then mcp-quota publishes no OAuth metadata at all).
func (s *contents) OAuth() *OAuth { return s.oauth }

// ExtraScopes are the scopes keys ask for beyond the [oauth] scopes.
func (s *contents) ExtraScopes() []string {
	var out []string
	for _, k := range s.keys {
		out = append(out, k.Scopes...)
		out = append(out, k.WriteScopes...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// NeedScopes returns the scopes a token needs to call key k with method:
// the [oauth] scopes, the key's scopes, and its write scopes for a method
// other than GET and HEAD.
func (s *contents) NeedScopes(k *Key, method string) []string {
	var need []string
	if s.oauth != nil {
		need = append(need, s.oauth.Scopes...)
	}
	need = append(need, k.Scopes...)
	if method != "GET" && method != "HEAD" && method != "" {
		need = append(need, k.WriteScopes...)
	}
	slices.Sort(need)
	return slices.Compact(need)
}

// Claims are a token's claims, as a principal rule reads them.
type Claims interface {
	// Values returns the string values of a claim (one, or each of an
	// array such as groups).
	Values(claim string) []string
}

// ErrUnknownPrincipal is wrapped by Principal's refusal of a principal
// no rule matches.
var ErrUnknownPrincipal = errors.New("unknown principal")

// Principal returns the caller a token with claims c speaks for: the
// first [[principals]] rule that matches, else the default principal
// when [oauth] default_keys are set. Its Name is the rule's name, and
// for a person's token (one whose subject is not the client itself)
// " via " and the client's configured name or client_id. A principal
// no rule matches, without default keys, gets an error that says what to
// ask an administrator for.
func (s *contents) Principal(c Claims) (*Caller, error) {
	client := first(c.Values("client_id"))
	sub := first(c.Values("sub"))
	var name string
	var keys []string
	for _, r := range s.principals {
		if slices.ContainsFunc(c.Values(r.Claim), func(v string) bool { return slices.Contains(r.Values, v) }) {
			name, keys = r.Name, r.Keys
			break
		}
	}
	var groups []string
	if s.oauth != nil {
		groups = c.Values(s.oauth.GroupsClaim)
	}
	admin := s.oauth != nil && s.oauth.AdminGroup != "" && slices.Contains(groups, s.oauth.AdminGroup)
	if name == "" && s.oauth != nil && len(s.oauth.DefaultKeys) > 0 {
		name, keys = first(c.Values(s.oauth.NameClaim)), s.oauth.DefaultKeys
	}
	if name == "" && admin {
		name = first(c.Values(s.oauth.NameClaim))
	}
	if name == "" {
		who := first(c.Values("email"))
		if who == "" {
			who = sub
		}
		ask := "an administrator"
		if s.oauth != nil && s.oauth.Contact != "" {
			ask = s.oauth.Contact
		}
		return nil, fmt.Errorf("%w: the token is valid, but %q (sub %q, client %q) is not a principal mcp-quota knows: ask %s to add a [[principals]] entry "+
			"matching one of your claims (sub, email, groups) with the keys you need", ErrUnknownPrincipal, who, sub, client, ask)
	}
	sight := s.sight(name, groups, admin)
	if client != "" && sub != "" && client != sub {
		label := client
		if s.oauth != nil && s.oauth.Clients[client] != "" {
			label = s.oauth.Clients[client]
		}
		name += via + label
	}
	return &Caller{Name: name, Keys: keys, OAuth: true, Sight: sight}, nil
}

func first(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// scopeToken reports whether s is a scope token (RFC 6749 §3.3) that fits
// in a quoted challenge: printable ASCII without space, '"' or '\'.
func scopeToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c <= 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// parseOAuth checks the [oauth] table and the [[principals]] entries.
func (s *contents) parseOAuth(oc *oauthConfig, pcs []principalConfig, env Env, keys map[string]bool) []*ConfigError {
	var errs []*ConfigError
	bad := func(field, msg string) { errs = append(errs, &ConfigError{Field: field, Msg: msg}) }
	if oc == nil {
		if len(pcs) > 0 {
			bad("principals", "[[principals]] map OAuth tokens to keys: add an [oauth] table with issuer and resource")
		}
		return errs
	}
	o := &OAuth{Resource: oc.Resource, Audience: oc.Audience, Scopes: oc.Scopes, Algorithms: oc.Algorithms, Skew: time.Duration(oc.Skew),
		IntrospectionClient: oc.IntrospectionClientID, IntrospectionCache: time.Duration(oc.IntrospectionCache),
		NameClaim: oc.NameClaim, DefaultKeys: oc.DefaultKeys, Contact: oc.Contact, Clients: oc.Clients,
		AdminGroup: oc.AdminGroup, GroupsClaim: oc.GroupsClaim, DashboardClient: oc.DashboardClientID, IssuerName: strings.TrimSpace(oc.IssuerName)}
	oc.servers(o, bad)
	oc.tokens(o, bad)
	oc.secrets(o, env, bad)
	checkKeys := func(field string, list []string) {
		for j, name := range list {
			if name != "*" && !keys[name] {
				bad(fmt.Sprintf("%s[%d]", field, j), fmt.Sprintf("key %q is not configured", name))
			}
		}
	}
	checkKeys("oauth.default_keys", o.DefaultKeys)
	for i, pc := range pcs {
		s.principal(i, pc, bad, checkKeys)
	}
	s.oauth = o
	return errs
}

// servers sets the authorization servers o trusts and the resource it
// serves.
func (oc *oauthConfig) servers(o *OAuth, bad func(field, msg string)) {
	if oc.Issuer != "" {
		o.Issuers = append(o.Issuers, oc.Issuer)
	}
	o.Issuers = append(o.Issuers, oc.Issuers...)
	if len(o.Issuers) == 0 {
		bad("oauth.issuer", "name the authorization server: issuer = \"https://idp.example.com\" (or issuers = [\"…\", \"…\"])")
	}
	for _, iss := range o.Issuers {
		u, err := url.Parse(iss)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			field := "oauth.issuers"
			if iss == oc.Issuer {
				field = "oauth.issuer"
			}
			bad(field, fmt.Sprintf("%q is not an issuer URL (https://host/path, no query or fragment)", iss))
		}
	}
	u, err := url.Parse(o.Resource)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		bad("oauth.resource", fmt.Sprintf("%q is not this server's canonical URI: write the URL clients use for MCP, e.g. resource = \"https://mcp.example.com/mcp\"", o.Resource))
	}
}

// tokens checks what o asks of a token: its scopes, algorithms, clock
// skew and the claim that names its bearer.
func (oc *oauthConfig) tokens(o *OAuth, bad func(field, msg string)) {
	for i, sc := range o.Scopes {
		if !scopeToken(sc) {
			bad(fmt.Sprintf("oauth.scopes[%d]", i), fmt.Sprintf("%q is not a scope (printable characters, no space or quote)", sc))
		}
	}
	for i, a := range o.Algorithms {
		if !slices.Contains(oauthAlgorithms, a) {
			bad(fmt.Sprintf("oauth.algorithms[%d]", i), fmt.Sprintf("%q is not allowed: use asymmetric algorithms (%s); none and HMAC (HS256…) never are",
				a, strings.Join(oauthAlgorithms, ", ")))
		}
	}
	if o.Skew > 5*time.Minute {
		bad("oauth.skew", "skew is at most 5m: it is how far the token's times may be off this clock")
	}
	if o.NameClaim == "" {
		o.NameClaim = "sub"
	}
	if o.GroupsClaim == "" {
		o.GroupsClaim = "groups"
	}
}

// secrets reads the dashboard's and introspection's client secrets.
func (oc *oauthConfig) secrets(o *OAuth, env Env, bad func(field, msg string)) {
	if oc.DashboardSecretEnv != "" && oc.DashboardClientID == "" {
		bad("oauth.dashboard_client_secret_env", "a dashboard client secret needs its client: set dashboard_client_id too")
	}
	if oc.DashboardSecretEnv != "" {
		if v := strings.TrimSpace(env.getenv(oc.DashboardSecretEnv)); v != "" {
			o.DashboardSecret = NewSecret(v)
		} else {
			bad("oauth.dashboard_client_secret_env", fmt.Sprintf("environment variable %s is not set", oc.DashboardSecretEnv))
		}
	}
	switch {
	case oc.IntrospectionSecretEnv != "" && oc.IntrospectionSecretFile != "":
		bad("oauth.introspection_secret_env", "set introspection_secret_env or introspection_secret_file, not both")
	case oc.IntrospectionSecretEnv != "":
		if v := strings.TrimSpace(env.getenv(oc.IntrospectionSecretEnv)); v != "" {
			o.IntrospectionSecret = NewSecret(v)
		} else {
			bad("oauth.introspection_secret_env", fmt.Sprintf("environment variable %s is not set", oc.IntrospectionSecretEnv))
		}
	case oc.IntrospectionSecretFile != "":
		if b, err := env.readFile(oc.IntrospectionSecretFile); err != nil || strings.TrimSpace(string(b)) == "" {
			bad("oauth.introspection_secret_file", fmt.Sprintf("cannot read %s, or it is empty", oc.IntrospectionSecretFile))
		} else {
			o.IntrospectionSecret = NewSecret(strings.TrimSpace(string(b)))
		}
	}
	if o.IntrospectionClient != "" && o.IntrospectionSecret.IsZero() && oc.IntrospectionSecretEnv == "" && oc.IntrospectionSecretFile == "" {
		bad("oauth.introspection_client_id", "introspection needs mcp-quota's client secret: set introspection_secret_env or introspection_secret_file")
	}
}

// principal checks the i-th [[principals]] entry and adds it.
func (s *contents) principal(i int, pc principalConfig, bad func(field, msg string), checkKeys func(field string, list []string)) {
	f := func(name string) string { return fmt.Sprintf("principals[%d].%s", i, name) }
	if pc.Name == "" || len(pc.Name) > 128 || strings.ContainsAny(pc.Name, "\"\\\r\n") {
		bad(f("name"), "name the principal as the activity and metrics should show it, e.g. name = \"alice@example.com\" or \"nightly-sync\"")
	}
	if pc.Claim == "" {
		pc.Claim = "sub"
	}
	if len(pc.Values) == 0 {
		bad(f("values"), fmt.Sprintf("list the values of claim %q that make this principal, e.g. values = [\"alice@example.com\"]", pc.Claim))
	}
	if strings.Contains(pc.Name, via) {
		bad(f("name"), fmt.Sprintf("a principal's name may not contain %q: the activity adds it before the client's name", via))
	}
	for j, v := range pc.VisibleTo {
		if msg := badViewer(v); msg != "" {
			bad(fmt.Sprintf("principals[%d].visible_to[%d]", i, j), msg)
		}
	}
	if len(pc.Keys) == 0 {
		bad(f("keys"), "list the keys this principal may use, e.g. keys = [\"example\"] (or [\"*\"])")
	}
	checkKeys(f("keys"), pc.Keys)
	if slices.ContainsFunc(s.principals, func(r PrincipalRule) bool { return r.Name == pc.Name }) {
		bad(f("name"), fmt.Sprintf("principal %q is configured twice", pc.Name))
	}
	s.principals = append(s.principals, PrincipalRule(pc))
}

// oauthAlgorithms are the JWS algorithms a configuration may allow.
var oauthAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// checkKeyScopes checks a key's scopes.
func checkKeyScopes(kc keyConfig, bad func(field, msg string)) {
	for j, sc := range kc.Scopes {
		if !scopeToken(sc) {
			bad(fmt.Sprintf("scopes[%d]", j), fmt.Sprintf("%q is not a scope (printable characters, no space or quote)", sc))
		}
	}
	for j, sc := range kc.WriteScopes {
		if !scopeToken(sc) {
			bad(fmt.Sprintf("write_scopes[%d]", j), fmt.Sprintf("%q is not a scope (printable characters, no space or quote)", sc))
		}
	}
}
