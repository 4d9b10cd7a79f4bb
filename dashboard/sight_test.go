package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// Who spends it, for a person who sees only some principals: those by
// name, the others summed in one line that names none of them.
func TestSpendersWithoutHidden(t *testing.T) {
	list := []spender{
		{Caller: "sync", Used: 30, Share: 0.6},
		{Caller: "bob@example.com via Claude.ai", Used: 10, Share: 0.2, Reserved: 25, Held: 15},
		{Caller: "agent", Used: 10, Share: 0.2},
		{Caller: "batch", Reserved: 50, Lent: 50},
	}
	bob := &keystore.Caller{Name: "bob@example.com via dash", Sight: &keystore.Sight{Principals: []string{"bob@example.com"}}}
	got := withoutHidden(list, bob)
	want := []spender{
		{Caller: "bob@example.com via Claude.ai", Used: 10, Share: 0.2, Reserved: 25, Held: 15},
		{Others: true, Used: 40, Share: 0.8, Reserved: 50, Lent: 50},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bob's spenders (-want +got):\n%s", diff)
	}
	admin := &keystore.Caller{Name: "carol", Sight: &keystore.Sight{All: true}}
	if diff := cmp.Diff(list, withoutHidden(list, admin)); diff != "" {
		t.Errorf("an administrator's spenders (-want +got):\n%s", diff)
	}
}

// The sign-in card offers the sign-in with the authorization server by
// its name only when it is configured; anyone may ask.
func TestSignInChoices(t *testing.T) {
	for _, tc := range []struct {
		name string
		oidc *OIDC
		want string
	}{
		{"none", nil, ""},
		{"named", &OIDC{Name: "Example SSO", Issuer: "https://login.example.com/realms/team", ClientID: "dash"}, "Sign in with Example SSO"},
		{"by host", &OIDC{Issuer: "https://login.example.com/realms/team", ClientID: "dash"}, "Sign in with login.example.com"},
		{"registers", &OIDC{Issuer: "https://login.example.com", Registration: registration("https://login.example.com/reg", nil)}, "Sign in with login.example.com"},
		{"no client, no registration", &OIDC{Issuer: "https://login.example.com", Registration: registration("", nil)}, ""},
		{"issuer down", &OIDC{Issuer: "https://login.example.com", Registration: registration("", errors.New("connection refused"))}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := New(Config{OIDC: tc.oidc})
			r := httptest.NewRequest(http.MethodGet, SignInOptionsPath, nil)
			if !h.Open(r) {
				t.Errorf("GET %s needs a caller", SignInOptionsPath)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			var got signInOptions
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK {
				t.Fatalf("GET %s: %d %s", SignInOptionsPath, w.Code, w.Body)
			}
			label := ""
			if got.OIDC != nil {
				label = got.OIDC.Label
				if got.OIDC.Path != SignInPath {
					t.Errorf("the button goes to %q, want %q", got.OIDC.Path, SignInPath)
				}
			}
			if label != tc.want {
				t.Errorf("label = %q, want %q", label, tc.want)
			}
		})
	}
}

func registration(endpoint string, err error) func(context.Context) (string, error) {
	return func(context.Context) (string, error) { return endpoint, err }
}
