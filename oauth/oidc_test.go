package oauth_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/mcp-quota/mcp-quota/internal/oidctest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/oauth"
)

const resource = "http://127.0.0.1:8787/mcp"

// counting counts the requests made to each path.
type counting struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *counting) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

func newServer(t testing.TB, issuers []string, introspect bool, opts ...func(*oauth.Config)) (*oauth.Server, *counting, *testkit.Clock) {
	t.Helper()
	rt := &counting{n: map[string]int{}}
	clk := testkit.NewClock(time.Now())
	c := oauth.Config{Issuers: issuers, Resource: resource, Scopes: []string{"mcp"},
		Client: &http.Client{Transport: rt, Timeout: 10 * time.Second}, Clock: clk}
	if introspect {
		c.IntrospectionClient, c.IntrospectionSecret = "mcp-quota", "mcp-quota-secret"
	}
	for _, o := range opts {
		o(&c)
	}
	s, err := oauth.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return s, rt, clk
}

func TestClientCredentialsJWT(t *testing.T) {
	iss := oidctest.Start(t, 1, "alice")
	s, _, _ := newServer(t, iss, false)
	tok := oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", resource, "mcp")
	p, err := s.Verify(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if p.Issuer != iss[0] || p.ClientID != "sync-job" || !p.HasScopes([]string{"mcp"}) || p.HasScopes([]string{"demo:write"}) {
		t.Fatalf("principal %+v", p)
	}
}

// TestRejections sends every kind of bad token a resource server must
// refuse, from a real authorization server or forged beside it.
func TestRejections(t *testing.T) {
	iss := oidctest.Start(t, 2, "alice")
	s, rt, clk := newServer(t, iss[:1], true)
	good := oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", resource, "mcp")
	if _, err := s.Verify(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	refused := func(t *testing.T, tok, why string) {
		t.Helper()
		_, err := s.Verify(t.Context(), tok)
		if !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), why) {
			t.Fatalf("got %v, want an invalid token because %q", err, why)
		}
		if strings.Contains(err.Error(), tok) {
			t.Fatal("the error names the token")
		}
	}
	t.Run("wrong audience", func(t *testing.T) {
		refused(t, oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", "http://127.0.0.1:1/other", "mcp"), "not issued for this resource")
	})
	t.Run("wrong issuer", func(t *testing.T) {
		refused(t, oidctest.ClientCredentials(t, iss[1], "sync-job", "sync-job-secret", resource, "mcp"), "is not trusted here")
	})
	t.Run("alg none", func(t *testing.T) {
		parts := strings.Split(good, ".")
		none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"at+jwt"}`)) + "." + parts[1] + "."
		refused(t, none, "allowed algorithm")
	})
	t.Run("HMAC", func(t *testing.T) {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("a secret that is the public key..")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: iss[0], Audience: jwt.Audience{resource}, Expiry: jwt.NewNumericDate(time.Now().Add(time.Minute))}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		refused(t, tok, "allowed algorithm")
	})
	t.Run("a key the JWKS does not have", func(t *testing.T) {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: "gone"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: iss[0], Subject: "mallory", Audience: jwt.Audience{resource},
			Expiry: jwt.NewNumericDate(time.Now().Add(time.Minute))}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		// The keys were fetched for the good token a moment ago: an
		// unknown key now makes no fetch. A minute later it makes one (a
		// rotation would have put it there); a second right after makes
		// none, and one a minute later one more: a stream of such
		// tokens costs the issuer at most one fetch a minute.
		fetches := rt.count("/jwks")
		refused(t, tok, `no key "gone"`)
		if n := rt.count("/jwks") - fetches; n != 0 {
			t.Fatalf("%d JWKS fetches right after the last, want 0", n)
		}
		clk.Advance(time.Minute)
		refused(t, tok, `no key "gone"`)
		if n := rt.count("/jwks") - fetches; n != 1 {
			t.Fatalf("%d JWKS fetches for an unknown key, want 1", n)
		}
		refused(t, tok, `no key "gone"`)
		if n := rt.count("/jwks") - fetches; n != 1 {
			t.Fatalf("%d JWKS fetches for two tokens with an unknown key, want 1", n)
		}
		clk.Advance(time.Minute)
		refused(t, tok, `no key "gone"`)
		if n := rt.count("/jwks") - fetches; n != 2 {
			t.Fatalf("%d JWKS fetches after a minute, want 2", n)
		}
	})
	t.Run("expired", func(t *testing.T) {
		clk.Advance(5*time.Minute + oauth.DefaultSkew + time.Second)
		refused(t, good, "expired")
	})
}

// TestIntrospection checks an opaque token at the issuer, keeps the
// answer, and refuses the token once it was revoked and the cache
// entry ended.
func TestIntrospection(t *testing.T) {
	iss := oidctest.Start(t, 1, "alice")
	s, rt, clk := newServer(t, iss, true)
	tok := oidctest.ClientCredentials(t, iss[0], "opaque-job", "opaque-job-secret", resource, "mcp")
	if strings.Count(tok, ".") == 2 {
		t.Fatal("the token is a JWT, not opaque")
	}
	p, err := s.Verify(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if p.ClientID != "opaque-job" || !p.HasScopes([]string{"mcp"}) {
		t.Fatalf("principal %+v", p)
	}
	asked := rt.count("/token/introspection")
	if _, err := s.Verify(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	if n := rt.count("/token/introspection"); n != asked {
		t.Fatalf("a second check within the cache asked the issuer again (%d, was %d)", n, asked)
	}
	oidctest.Revoke(t, iss[0], "opaque-job", "opaque-job-secret", tok)
	clk.Advance(time.Minute)
	if _, err := s.Verify(t.Context(), tok); !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), "not active") {
		t.Fatalf("a revoked token after the cache ended: %v", err)
	}

	// A token of an audience other than this resource is refused too.
	other := oidctest.ClientCredentials(t, iss[0], "opaque-job", "opaque-job-secret", "http://127.0.0.1:1/other", "mcp")
	if _, err := s.Verify(t.Context(), other); !errors.Is(err, oauth.ErrInvalidToken) {
		t.Fatalf("an opaque token for another resource: %v", err)
	}
}

// TestOpaqueWithoutIntrospection refuses opaque tokens when no
// introspection is configured.
func TestOpaqueWithoutIntrospection(t *testing.T) {
	s, err := oauth.New(oauth.Config{Issuers: []string{"http://127.0.0.1:1"}, Resource: resource})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(t.Context(), "opaque-token-value"); !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), "no introspection") {
		t.Fatalf("got %v", err)
	}
}

func TestConfigRefusesWeakAlgorithms(t *testing.T) {
	for _, alg := range []string{"none", "HS256"} {
		if _, err := oauth.New(oauth.Config{Issuers: []string{"https://idp.example"}, Resource: resource, Algorithms: []string{alg}}); err == nil {
			t.Errorf("algorithm %s accepted", alg)
		}
	}
}

// TestIssuerDown: an issuer that does not answer makes the check
// unavailable (not invalid), and is asked again only after a few seconds,
// not once per request.
func TestIssuerDown(t *testing.T) {
	s, rt, clk := newServer(t, []string{"http://127.0.0.1:1"}, true)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: "k"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	jwtTok, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: "http://127.0.0.1:1", Audience: jwt.Audience{resource},
		Expiry: jwt.NewNumericDate(time.Now().Add(time.Minute))}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	total := func() int {
		return rt.count("/.well-known/oauth-authorization-server") + rt.count("/.well-known/openid-configuration")
	}
	for _, tok := range []string{jwtTok, "an-opaque-token"} {
		for range 3 {
			if _, err := s.Verify(t.Context(), tok); !errors.Is(err, oauth.ErrUnavailable) {
				t.Fatalf("issuer down: %v, want unavailable", err)
			}
		}
	}
	if n := total(); n != 2 {
		t.Fatalf("%d metadata requests for six checks within seconds, want 2 (RFC 8414, then OpenID)", n)
	}
	clk.Advance(5 * time.Second)
	if _, err := s.Verify(t.Context(), jwtTok); !errors.Is(err, oauth.ErrUnavailable) {
		t.Fatal(err)
	}
	if n := total(); n != 4 {
		t.Fatalf("%d metadata requests after 5 s, want 4", n)
	}
}

// TestAudience: with an audience configured apart from the resource (as
// Microsoft Entra ID's tokens need), tokens must carry it, not the
// resource.
func TestAudience(t *testing.T) {
	iss := oidctest.Start(t, 1, "alice")
	const aud = "http://127.0.0.1:1/app"
	s, _, _ := newServer(t, iss, false, func(c *oauth.Config) { c.Audience = aud })
	if _, err := s.Verify(t.Context(), oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", aud, "mcp")); err != nil {
		t.Fatalf("a token for the audience: %v", err)
	}
	_, err := s.Verify(t.Context(), oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", resource, "mcp"))
	if !errors.Is(err, oauth.ErrInvalidToken) {
		t.Fatalf("a token for the resource, not the audience: %v", err)
	}
}
