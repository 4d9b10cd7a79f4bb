package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// claims are the registered claims and those the MCP profile adds.
type claims struct {
	jwt.Claims
	ClientID string `json:"client_id"`
	AZP      string `json:"azp"`
	Scope    string `json:"scope"`
}

// verifyJWT checks a JWT access token: a trusted issuer, an allowed
// algorithm, a key of that issuer's JWKS, this resource as audience, and
// its lifetime.
func (s *Server) verifyJWT(ctx context.Context, token string) (*Principal, error) {
	tok, err := jwt.ParseSigned(token, s.algs)
	if err != nil {
		return nil, invalid("not a JWT signed with an allowed algorithm (%s)", strings.Join(s.c.Algorithms, ", "))
	}
	if len(tok.Headers) != 1 {
		return nil, invalid("the JWT has more than one signature")
	}
	h := tok.Headers[0]
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ != "" && !strings.EqualFold(typ, "at+jwt") && !strings.EqualFold(typ, "application/at+jwt") && !strings.EqualFold(typ, "JWT") {
		return nil, invalid("the JWT's typ %q is not an access token's", clip(typ))
	}
	var unverified claims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, invalid("the JWT's claims cannot be read")
	}
	iss, ok := s.issuers[unverified.Issuer]
	if !ok {
		return nil, invalid("issuer %q is not trusted here", clip(unverified.Issuer))
	}
	key, err := iss.key(ctx, h.KeyID, h.Algorithm)
	if err != nil {
		return nil, err
	}
	var c claims
	var all map[string]any
	if err := tok.Claims(key.Key, &c, &all); err != nil {
		return nil, invalid("the JWT's signature does not verify with the issuer's key")
	}
	if c.Expiry == nil {
		return nil, invalid("the JWT has no exp")
	}
	err = c.ValidateWithLeeway(jwt.Expected{Issuer: iss.id, AnyAudience: jwt.Audience{s.c.Audience}, Time: s.c.Clock.Now()}, s.c.Skew)
	switch {
	case errors.Is(err, jwt.ErrInvalidAudience):
		return nil, invalid("the token was not issued for this resource (its audience is not %s)", s.c.Audience)
	case errors.Is(err, jwt.ErrExpired):
		return nil, invalid("the token expired")
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return nil, invalid("the token is not valid yet")
	case err != nil:
		return nil, invalid("the token's claims do not hold: %v", err)
	}
	client := c.ClientID
	if client == "" {
		client = c.AZP
	}
	return &Principal{Issuer: iss.id, Subject: c.Subject, ClientID: client, Scopes: scopes(c.Scope, all["scp"]),
		Expiry: c.Expiry.Time(), Claims: all}, nil
}

// scopes are a token's scopes: its scope claim (RFC 9068, space
// separated), else scp, which Okta writes as an array and Microsoft Entra
// ID as a space-separated string.
func scopes(scope string, scp any) []string {
	if scope != "" {
		return strings.Fields(scope)
	}
	switch v := scp.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		return nonEmptyStrings(v)
	}
	return nil
}

// nonEmptyStrings returns the non-empty strings of a JSON array, in order.
func nonEmptyStrings(v []any) []string {
	var out []string
	for _, e := range v {
		if s, ok := e.(string); ok && s != "" {
			out = append(out, s)
		}
	}
	return out
}

// An issuer is a trusted authorization server: its metadata and keys,
// fetched on first use and kept.
type issuer struct {
	id string
	s  *Server

	mu        sync.Mutex
	meta      *metadata
	keys      jose.JSONWebKeySet
	fetched   time.Time // when keys were last fetched
	attempted time.Time // when a fetch was last tried
	failed    bool      // the last fetch failed
	metaTried time.Time // when the metadata was last asked for
	metaErr   error     // why it could not be read then
}

// keysRetry is how long after a failed fetch of an issuer's metadata or
// keys the next is tried.
const keysRetry = 5 * time.Second

// metadata is what mcp-quota reads of RFC 8414 / OpenID discovery.
type metadata struct {
	Issuer                string `json:"issuer"`
	AuthorizationEndpoint string `json:"authorization_endpoint"`
	TokenEndpoint         string `json:"token_endpoint"`
	JWKSURI               string `json:"jwks_uri"`
	IntrospectionEndpoint string `json:"introspection_endpoint"`
	RegistrationEndpoint  string `json:"registration_endpoint"`
}

// metadata returns the issuer's metadata, fetching it once: RFC 8414's
// well-known URI (the issuer's path after the well-known prefix), then
// OpenID discovery's (appended to the issuer).
func (i *issuer) metadata(ctx context.Context) (*metadata, error) {
	if i.meta != nil {
		return i.meta, nil
	}
	now := i.s.c.Clock.Now()
	if i.metaErr != nil && now.Sub(i.metaTried) < keysRetry {
		return nil, i.metaErr
	}
	i.metaTried = now
	m, err := i.discover(ctx)
	i.meta, i.metaErr = m, err
	return m, err
}

// discover reads the issuer's metadata.
func (i *issuer) discover(ctx context.Context) (*metadata, error) {
	base, path, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(i.id, "https://"), "http://"), "/")
	scheme := i.id[:strings.Index(i.id, "://")+3]
	path = strings.TrimSuffix(path, "/")
	if path != "" {
		path = "/" + path
	}
	urls := []string{
		scheme + base + "/.well-known/oauth-authorization-server" + path,
		strings.TrimSuffix(i.id, "/") + "/.well-known/openid-configuration",
	}
	var last error
	for _, u := range urls {
		var m metadata
		if err := i.s.getJSON(ctx, u, &m); err != nil {
			last = err
			continue
		}
		if m.Issuer != i.id {
			last = fmt.Errorf("%s names issuer %q, not %q", u, m.Issuer, i.id)
			continue
		}
		return &m, nil
	}
	return nil, fmt.Errorf("%w: the metadata of issuer %s cannot be read: %v", ErrUnavailable, i.id, last)
}

// key returns the issuer's key kid for alg. The JWKS is fetched when it
// is older than KeysMaxAge, or when kid is not in it (a rotation) and no
// fetch was tried in the last KeysMinRefresh: a stream of tokens naming
// unknown keys costs the issuer at most one fetch a KeysMinRefresh.
func (i *issuer) key(ctx context.Context, kid, alg string) (*jose.JSONWebKey, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	now := i.s.c.Clock.Now()
	stale := i.fetched.IsZero() || now.Sub(i.fetched) > i.s.c.KeysMaxAge
	k := find(i.keys, kid, alg)
	// A failed fetch is tried again after keysRetry at the earliest: an
	// issuer that is down is not asked once per request.
	failedLately := i.failed && now.Sub(i.attempted) < keysRetry
	if (stale && !failedLately) || (k == nil && now.Sub(i.attempted) >= i.s.c.KeysMinRefresh) {
		i.attempted = now
		err := i.fetchKeys(ctx)
		i.failed = err != nil
		if err != nil && (k == nil || i.fetched.IsZero()) {
			return nil, err
		}
		k = find(i.keys, kid, alg)
	} else if i.fetched.IsZero() {
		return nil, fmt.Errorf("%w: the keys of issuer %s could not be read a moment ago", ErrUnavailable, i.id)
	}
	if k == nil {
		return nil, invalid("issuer %s has no key %q for %s", i.id, clip(kid), alg)
	}
	return k, nil
}

func (i *issuer) fetchKeys(ctx context.Context) error {
	m, err := i.metadata(ctx)
	if err != nil {
		return err
	}
	if m.JWKSURI == "" {
		return fmt.Errorf("%w: issuer %s publishes no jwks_uri", ErrUnavailable, i.id)
	}
	var set jose.JSONWebKeySet
	if err := i.s.getJSON(ctx, m.JWKSURI, &set); err != nil {
		return fmt.Errorf("%w: the keys of issuer %s cannot be read: %v", ErrUnavailable, i.id, err)
	}
	i.keys, i.fetched = set, i.s.c.Clock.Now()
	return nil
}

// find returns the public signing key kid of set that may verify alg: a
// key meant for encryption, a private or symmetric key, or one whose own
// alg is another is never used.
func find(set jose.JSONWebKeySet, kid, alg string) *jose.JSONWebKey {
	for _, k := range set.Keys {
		if k.KeyID != kid || (k.Use != "" && k.Use != "sig") || (k.Algorithm != "" && k.Algorithm != alg) || !k.IsPublic() || !k.Valid() {
			continue
		}
		return &k
	}
	return nil
}

// getJSON fetches u into v: 200 and at most 1 MiB.
func (s *Server) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.c.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}
