// Package oauth makes mcp-quota an OAuth 2.1 resource server, as the MCP
// authorization specification asks: it publishes RFC 9728 protected
// resource metadata, answers requests without a usable token with a
// Bearer challenge that points at it, and checks the access tokens
// clients bring — JWTs against the JWKS of a trusted issuer (found by
// RFC 8414 or OpenID discovery), opaque tokens by RFC 7662 introspection.
//
// A token is accepted only when a trusted issuer issued it for this
// resource (RFC 8707: its audience is the configured resource), it is in
// its lifetime (with a small stated skew) and, for a JWT, it is signed
// with an allowed asymmetric algorithm by a key the issuer publishes.
// Tokens are never kept, logged or forwarded: the introspection cache is
// keyed by a SHA-256 digest of the token.
package oauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/mcp-quota/mcp-quota/clock"
)

// DefaultSkew is how far the token's exp and nbf may be off this
// machine's clock.
const DefaultSkew = 30 * time.Second

// DefaultAlgorithms are the JWS algorithms accepted when the configuration
// names none: asymmetric ones only, so a public key can never be taken
// for an HMAC secret, and never "none".
var DefaultAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// Config is how the resource server checks tokens.
type Config struct {
	// Issuers are the trusted authorization servers' issuer identifiers.
	Issuers []string
	// Resource is this server's canonical URI: a token's audience must be
	// it. Its path, when not empty or "/", is where the MCP endpoint is.
	Resource string
	// Audience is the aud a token must carry; empty means Resource.
	// (Microsoft Entra ID's v2.0 tokens carry the application's client
	// ID instead.)
	Audience string
	// Scopes are those every token must carry; also advertised as
	// scopes_supported with ExtraScopes.
	Scopes []string
	// ExtraScopes are the further scopes some keys or methods need.
	ExtraScopes []string
	// Algorithms allowed for JWTs; nil means DefaultAlgorithms.
	Algorithms []string
	// Skew is the clock skew allowed on exp and nbf; 0 means DefaultSkew.
	Skew time.Duration
	// IntrospectionClient and IntrospectionSecret authenticate mcp-quota
	// to the issuers' introspection endpoints (client_secret_basic);
	// without a client ID, opaque tokens are refused.
	IntrospectionClient string
	IntrospectionSecret string
	// IntrospectionCache bounds how long an introspection's answer is
	// kept (never beyond the token's exp); 0 means one minute.
	IntrospectionCache time.Duration
	// KeysMaxAge is how long a fetched JWKS is used before it is fetched
	// again; 0 means one hour. KeysMinRefresh is the least time between
	// two fetches prompted by a token whose key is not in the set
	// (rotation); 0 means one minute.
	KeysMaxAge     time.Duration
	KeysMinRefresh time.Duration
	// Client fetches metadata, keys and introspections; nil means a
	// client with a 10 s timeout.
	Client *http.Client
	// Clock is the time it reads; nil means real time.
	Clock clock.Clock
}

// A Principal is who a valid token speaks for: its claims.
type Principal struct {
	Issuer   string
	Subject  string
	ClientID string
	Scopes   []string
	Expiry   time.Time
	// Claims are every claim, to map the principal by any of them.
	Claims map[string]any
}

// Values returns the string values of claim: a string, or each string of
// an array (groups); "scope" yields the scopes.
func (p *Principal) Values(claim string) []string {
	switch claim {
	case "sub":
		return nonEmpty(p.Subject)
	case "client_id":
		return nonEmpty(p.ClientID)
	case "iss":
		return nonEmpty(p.Issuer)
	case "scope":
		return p.Scopes
	}
	switch v := p.Claims[claim].(type) {
	case string:
		return nonEmpty(v)
	case []any:
		return nonEmptyStrings(v)
	case []string:
		return v
	}
	return nil
}

// HasScopes reports whether p carries every scope of need.
func (p *Principal) HasScopes(need []string) bool {
	for _, s := range need {
		if !slices.Contains(p.Scopes, s) {
			return false
		}
	}
	return true
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// ErrInvalidToken is what every rejected token's error wraps: the
// request gets 401 with error="invalid_token".
var ErrInvalidToken = errors.New("invalid token")

// ErrUnavailable says no issuer could be asked (its metadata, keys or
// introspection did not answer): the request gets 503, not 401.
var ErrUnavailable = errors.New("authorization server unavailable")

// A Server checks tokens for one resource. It is safe for concurrent use.
type Server struct {
	c        Config
	algs     []jose.SignatureAlgorithm
	issuers  map[string]*issuer
	metaPath []string // the paths the metadata is served at

	introMu sync.Mutex
	intro   map[[32]byte]introspected
}

// New checks c and returns its Server. Issuer metadata is fetched on
// first use, so a server starts while its issuer is down.
func New(c Config) (*Server, error) {
	if len(c.Issuers) == 0 {
		return nil, errors.New("oauth: at least one issuer is needed")
	}
	ru, err := url.Parse(c.Resource)
	if err != nil || (ru.Scheme != "https" && ru.Scheme != "http") || ru.Host == "" || ru.Fragment != "" || ru.RawQuery != "" {
		return nil, fmt.Errorf("oauth: resource %q is not an absolute http(s) URI without query or fragment", c.Resource)
	}
	if c.Audience == "" {
		c.Audience = c.Resource
	}
	if c.Algorithms == nil {
		c.Algorithms = DefaultAlgorithms
	}
	if c.Skew == 0 {
		c.Skew = DefaultSkew
	}
	if c.IntrospectionCache <= 0 {
		c.IntrospectionCache = time.Minute
	}
	if c.KeysMaxAge <= 0 {
		c.KeysMaxAge = time.Hour
	}
	if c.KeysMinRefresh <= 0 {
		c.KeysMinRefresh = time.Minute
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: 10 * time.Second}
	}
	c.Clock = clock.Or(c.Clock)
	s := &Server{c: c, issuers: map[string]*issuer{}, intro: map[[32]byte]introspected{}}
	for _, a := range c.Algorithms {
		if err := checkAlgorithm(a); err != nil {
			return nil, err
		}
		s.algs = append(s.algs, jose.SignatureAlgorithm(a))
	}
	for _, iss := range c.Issuers {
		u, err := url.Parse(iss)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("oauth: issuer %q is not an absolute http(s) URL without query or fragment", iss)
		}
		s.issuers[iss] = &issuer{id: iss, s: s}
	}
	s.metaPath = []string{"/.well-known/oauth-protected-resource"}
	if p := strings.TrimSuffix(ru.EscapedPath(), "/"); p != "" {
		s.metaPath = append(s.metaPath, "/.well-known/oauth-protected-resource"+p)
	}
	return s, nil
}

// CheckAlgorithm refuses what may never check a token: "none", HMAC
// (a shared secret a client could forge with the issuer's public key),
// and names that are not JWS algorithms.
func checkAlgorithm(a string) error {
	if !slices.Contains(DefaultAlgorithms, a) {
		return fmt.Errorf("oauth: algorithm %q is not allowed: use asymmetric ones (%s); none and HMAC (HS256…) never are",
			a, strings.Join(DefaultAlgorithms, ", "))
	}
	return nil
}

// CheckAlgorithm is checkAlgorithm for the configuration.
func CheckAlgorithm(a string) error { return checkAlgorithm(a) }

// Resource is the configured resource URI.
func (s *Server) Resource() string { return s.c.Resource }

// Scopes are the scopes every token needs.
func (s *Server) Scopes() []string { return s.c.Scopes }

// Verify checks token and returns its principal. A token that is not
// valid here gets an error wrapping ErrInvalidToken (whose text names
// why, never the token); an issuer that cannot be reached gets one
// wrapping ErrUnavailable.
func (s *Server) Verify(ctx context.Context, token string) (*Principal, error) {
	if strings.Count(token, ".") == 2 {
		return s.verifyJWT(ctx, token)
	}
	return s.introspect(ctx, token)
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidToken, fmt.Sprintf(format, a...))
}

// clip shortens a value the token names (its issuer, key ID, type) for a
// message: the token's sender chose it.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
