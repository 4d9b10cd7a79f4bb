package dashboard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/rest"
)

// OIDC is the dashboard's sign-in with the OAuth authorization server:
// authorization code with PKCE, beside the sign-in with a caller token.
// The browser is sent to the authorization server and back to
// CallbackPath; the access token it brings (asked for the resource) is
// checked like any other and mapped to its principal, whose session the
// browser then holds. The token itself is dropped.
type OIDC struct {
	// Name is the authorization server as people know it ("Example
	// SSO"): the sign-in card's button says "Sign in with" it. Empty
	// means the host of Issuer.
	Name string
	// Issuer is the authorization server's issuer URL.
	Issuer string
	// ClientID is the dashboard's client at the authorization server.
	// Empty means the dashboard registers itself there as a public
	// client (RFC 7591), once per process, at the first sign-in, when
	// Registration names an endpoint; without one there is no sign-in
	// with the authorization server (the card shows no button).
	ClientID     string
	ClientSecret string // empty for a public client
	// Registration returns the authorization server's client
	// registration endpoint, or "" when it has none; nil means none.
	Registration func(ctx context.Context) (string, error)
	// Resource is mcp-quota's resource URI: the token is asked for it,
	// and the callback is at its origin.
	Resource string
	Scopes   []string
	// Endpoints returns the authorization server's authorization and
	// token endpoints.
	Endpoints func(ctx context.Context) (authorize, token string, err error)
	// Caller checks an access token and returns its principal.
	Caller func(ctx context.Context, token string) (*keystore.Caller, error)
	// Client sends the token request; nil means a 10 s client.
	Client *http.Client
}

// The sign-in's paths, and the cookie that carries its state and PKCE
// verifier between them.
const (
	SignInPath   = "/ui/signin/oidc"
	CallbackPath = "/ui/signin/callback"
	flowCookie   = "mcpq_oidc"
)

// SignInOptionsPath answers which sign-ins the page offers; anyone may
// read it (it names no caller and no key).
const SignInOptionsPath = "/ui/api/signin"

// signInOptions is SignInOptionsPath's answer: the sign-in with the
// authorization server, when it is configured, beside the token form.
type signInOptions struct {
	OIDC *oidcOption `json:"oidc,omitempty"`
}

type oidcOption struct {
	Label string `json:"label"` // the button's text: Sign in with <issuer name>
	Path  string `json:"path"`  // where the button goes
}

// label is the sign-in button's text.
func (o *OIDC) label() string {
	name := o.Name
	if name == "" {
		if u, err := url.Parse(o.Issuer); err == nil && u.Host != "" {
			name = u.Host
		} else {
			name = "the authorization server"
		}
	}
	return "Sign in with " + name
}

// signInChoices serves SignInOptionsPath. The sign-in with the
// authorization server is offered when the dashboard has a client there,
// or may register one.
func (h *Handler) signInChoices(w http.ResponseWriter, r *http.Request) {
	var out signInOptions
	if o := h.c.OIDC; o != nil && (o.ClientID != "" || h.mayRegister(r.Context())) {
		out.OIDC = &oidcOption{Label: o.label(), Path: SignInPath}
	}
	writeJSON(w, out)
}

// registrationWait bounds how long the sign-in card waits to learn
// whether the authorization server takes registrations.
const registrationWait = 3 * time.Second

// mayRegister reports whether the dashboard has registered its client,
// or the authorization server names a registration endpoint.
func (h *Handler) mayRegister(ctx context.Context) bool {
	h.client.mu.Lock()
	id := h.client.id
	h.client.mu.Unlock()
	if id != "" {
		return true
	}
	if h.c.OIDC.Registration == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, registrationWait)
	defer cancel()
	endpoint, err := h.c.OIDC.Registration(ctx)
	return err == nil && endpoint != ""
}

// registered is the client the dashboard registered at the
// authorization server; safe for concurrent use.
type registered struct {
	mu sync.Mutex
	id string
}

// errNoClient is clientID's error when there is no client to sign in
// with.
var errNoClient = errors.New("no dashboard_client_id is configured and the authorization server offers no client registration")

// clientID returns the dashboard's client at the authorization server:
// the configured one, or the one it registered (registering it first).
func (h *Handler) clientID(ctx context.Context) (string, error) {
	o := h.c.OIDC
	if o.ClientID != "" {
		return o.ClientID, nil
	}
	h.client.mu.Lock()
	defer h.client.mu.Unlock()
	if h.client.id != "" {
		return h.client.id, nil
	}
	if o.Registration == nil {
		return "", errNoClient
	}
	endpoint, err := o.Registration(ctx)
	if err != nil {
		return "", err
	}
	if endpoint == "" {
		return "", errNoClient
	}
	body, _ := json.Marshal(map[string]any{
		"client_name":                "mcp-quota dashboard",
		"redirect_uris":              []string{o.redirectURI()},
		"token_endpoint_auth_method": "none",
		"grant_types":                []string{"authorization_code"},
		"response_types":             []string{"code"},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := o.client().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		ClientID string `json:"client_id"`
		Error    string `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return "", fmt.Errorf("client registration answered %s: %w", resp.Status, err)
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK || out.ClientID == "" {
		return "", fmt.Errorf("client registration answered %s %s", resp.Status, clip(out.Error))
	}
	h.client.id = out.ClientID
	return out.ClientID, nil
}

func (o *OIDC) client() *http.Client {
	if o.Client != nil {
		return o.Client
	}
	return &http.Client{Timeout: 10 * time.Second}
}

// oidcRoutes adds the sign-in's routes, when it is configured.
func (h *Handler) oidcRoutes() {
	h.mux.HandleFunc("GET "+SignInOptionsPath, h.signInChoices)
	if h.c.OIDC == nil {
		return
	}
	h.mux.HandleFunc("GET "+SignInPath, h.oidcStart)
	h.mux.HandleFunc("GET "+CallbackPath, h.oidcCallback)
}

func (o *OIDC) redirectURI() string {
	u, _ := url.Parse(o.Resource)
	return u.Scheme + "://" + u.Host + CallbackPath
}

// oidcStart sends the browser to the authorization server with a fresh
// state and PKCE challenge, kept in a short-lived HttpOnly cookie.
func (h *Handler) oidcStart(w http.ResponseWriter, r *http.Request) {
	o := h.c.OIDC
	authorize, _, err := o.Endpoints(r.Context())
	var clientID string
	if err == nil {
		clientID, err = h.clientID(r.Context())
	}
	if errors.Is(err, errNoClient) {
		h.c.Log.Warn("dashboard sign-in: no client at the authorization server", "err", err)
		rest.WriteProblem(w, http.StatusServiceUnavailable, rest.CodeUpstreamUnavailable,
			"The dashboard has no client at the authorization server: sign in with a caller token, and ask an administrator to set [oauth] dashboard_client_id.", nil)
		return
	}
	if err != nil {
		h.c.Log.Warn("dashboard sign-in: the authorization server does not answer", "err", err)
		rest.WriteProblem(w, http.StatusServiceUnavailable, rest.CodeUpstreamUnavailable, "The authorization server does not answer; sign in with a caller token, or try again shortly.", nil)
		return
	}
	state, verifier := newID(), newID()
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{
		"response_type":         {"code"},
		"client_id":             {clientID},
		"redirect_uri":          {o.redirectURI()},
		"state":                 {state},
		"code_challenge":        {base64.RawURLEncoding.EncodeToString(sum[:])},
		"code_challenge_method": {"S256"},
		"resource":              {o.Resource},
	}
	if len(o.Scopes) > 0 {
		q.Set("scope", strings.Join(o.Scopes, " "))
	}
	// Lax, not Strict: the cookie must come back with the authorization
	// server's redirect, a cross-site navigation.
	http.SetCookie(w, &http.Cookie{Name: flowCookie, Value: state + "." + verifier, Path: CallbackPath, MaxAge: 600,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
	sep := "?"
	if strings.Contains(authorize, "?") {
		sep = "&"
	}
	http.Redirect(w, r, authorize+sep+q.Encode(), http.StatusSeeOther)
}

// oidcCallback takes the code back: it checks the state against the
// cookie, exchanges the code with the verifier, checks the access token
// and signs the browser in as its principal.
func (h *Handler) oidcCallback(w http.ResponseWriter, r *http.Request) {
	o := h.c.OIDC
	http.SetCookie(w, &http.Cookie{Name: flowCookie, Value: "", Path: CallbackPath, MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil})
	fail := func(status int, code, detail string) {
		secureHeaders(w)
		rest.WriteProblem(w, status, code, detail, nil)
	}
	if e := r.URL.Query().Get("error"); e != "" {
		fail(http.StatusForbidden, rest.CodeForbidden, "The authorization server refused the sign-in ("+clip(e)+"). Start again from the dashboard.")
		return
	}
	c, err := r.Cookie(flowCookie)
	state, verifier, ok := "", "", false
	if err == nil {
		state, verifier, ok = strings.Cut(c.Value, ".")
	}
	got := r.URL.Query().Get("state")
	if !ok || got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(state)) != 1 {
		fail(http.StatusBadRequest, rest.CodeBadRequest, "This sign-in was not started here, or took longer than ten minutes: start again from the dashboard.")
		return
	}
	token, err := h.exchange(r.Context(), r.URL.Query().Get("code"), verifier)
	if err != nil {
		h.c.Log.Warn("dashboard sign-in: the code exchange failed", "err", err)
		fail(http.StatusBadGateway, rest.CodeUpstreamUnavailable, "The authorization server did not give a token for the sign-in. Start again from the dashboard.")
		return
	}
	caller, err := o.Caller(r.Context(), token)
	if err != nil {
		fail(http.StatusForbidden, rest.CodeForbidden, err.Error())
		return
	}
	h.sessions.end(r)
	id, _ := h.sessions.start(caller)
	setCookie(w, r, id, int(SessionLifetime.Seconds()))
	h.c.Log.Info("dashboard sign-in", "caller", caller.Name, "with", "oauth")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// exchange trades code for an access token at the token endpoint.
func (h *Handler) exchange(ctx context.Context, code, verifier string) (string, error) {
	o := h.c.OIDC
	_, tokenURL, err := o.Endpoints(ctx)
	if err != nil {
		return "", err
	}
	clientID, err := h.clientID(ctx)
	if err != nil {
		return "", err
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {o.redirectURI()},
		"code_verifier": {verifier}, "resource": {o.Resource}}
	if o.ClientSecret == "" {
		form.Set("client_id", clientID)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if o.ClientSecret != "" {
		req.SetBasicAuth(url.QueryEscape(o.ClientID), url.QueryEscape(o.ClientSecret))
	}
	resp, err := o.client().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || out.AccessToken == "" {
		return "", &exchangeError{status: resp.Status, code: clip(out.Error)}
	}
	return out.AccessToken, nil
}

type exchangeError struct{ status, code string }

func (e *exchangeError) Error() string { return "token endpoint answered " + e.status + " " + e.code }

// clip keeps an error code from the authorization server short and plain.
func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return -1
		}
		return r
	}, s)
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}
