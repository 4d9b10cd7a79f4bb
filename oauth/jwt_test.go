package oauth_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/mcp-quota/mcp-quota/oauth"
)

// keyIssuer is an authorization server whose keys the test holds, so
// that it can sign what a real one never issues: RFC 8414 metadata and a
// JWKS on loopback, and a private key for each kid of the JWKS.
type keyIssuer struct {
	url  string
	keys map[string]*rsa.PrivateKey
}

// startKeyIssuer serves the JWKS published, whose private keys are keys.
func startKeyIssuer(t *testing.T, keys map[string]*rsa.PrivateKey, published []jose.JSONWebKey) *keyIssuer {
	t.Helper()
	iss := &keyIssuer{keys: keys}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"issuer": iss.url, "jwks_uri": iss.url + "/jwks"})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: published})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	iss.url = srv.URL
	return iss
}

// sign returns a JWT of claims signed RS256 with kid's key, its header's
// typ typ.
func (iss *keyIssuer) sign(t *testing.T, kid, typ string, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType(jose.ContentType(typ))
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: iss.keys[kid], KeyID: kid}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestRefusesWhatAnIssuerShouldNotHaveSigned: a token the issuer's own key
// signed is still refused when it has no exp, when its typ is not an
// access token's, or when the JWKS publishes its key for encryption, for
// another algorithm or with its private part.
func TestRefusesWhatAnIssuerShouldNotHaveSigned(t *testing.T) {
	keys := map[string]*rsa.PrivateKey{}
	for _, kid := range []string{"sig", "enc", "ps256", "private"} {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		keys[kid] = k
	}
	iss := startKeyIssuer(t, keys, []jose.JSONWebKey{
		{Key: &keys["sig"].PublicKey, KeyID: "sig", Use: "sig", Algorithm: "RS256"},
		{Key: &keys["enc"].PublicKey, KeyID: "enc", Use: "enc"},
		{Key: &keys["ps256"].PublicKey, KeyID: "ps256", Algorithm: "PS256"},
		{Key: keys["private"], KeyID: "private", Use: "sig", Algorithm: "RS256"},
	})
	s, _, _ := newServer(t, []string{iss.url}, false)
	claims := func(drop string) map[string]any {
		c := map[string]any{"iss": iss.url, "sub": "mallory", "aud": resource, "client_id": "job", "scope": "mcp",
			"exp": time.Now().Add(time.Minute).Unix()}
		delete(c, drop)
		return c
	}
	if p, err := s.Verify(t.Context(), iss.sign(t, "sig", "at+jwt", claims(""))); err != nil || p.ClientID != "job" {
		t.Fatalf("a token as it should be: %+v, %v; want it accepted", p, err)
	}
	for _, tt := range []struct {
		name, token, why string
	}{
		{"no exp", iss.sign(t, "sig", "at+jwt", claims("exp")), "no exp"},
		{"a logout token's typ", iss.sign(t, "sig", "logout+jwt", claims("")), "not an access token's"},
		{"a key for encryption", iss.sign(t, "enc", "at+jwt", claims("")), `no key "enc"`},
		{"a key for another algorithm", iss.sign(t, "ps256", "at+jwt", claims("")), `no key "ps256"`},
		{"a key published with its private part", iss.sign(t, "private", "at+jwt", claims("")), `no key "private"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Verify(t.Context(), tt.token)
			if !errors.Is(err, oauth.ErrInvalidToken) || !strings.Contains(err.Error(), tt.why) {
				t.Fatalf("got %v, want an invalid token because %q", err, tt.why)
			}
		})
	}
}
