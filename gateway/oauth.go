package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mcp-quota/mcp-quota/dashboard"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/oauth"
	"github.com/mcp-quota/mcp-quota/rest"
)

// Problem codes of the OAuth walls.
const (
	codeInsufficientScope = "insufficientScope"
	codeUnknownPrincipal  = "unknownPrincipal"
)

// oauthRoutes serves the protected resource metadata, when OAuth is on.
func oauthRoutes(mux *http.ServeMux, o *oauth.Server) {
	if o == nil {
		return
	}
	for _, p := range o.MetadataPaths() {
		mux.HandleFunc("GET "+p, o.ServeMetadata)
	}
}

// oauthOpen reports whether r asks for the protected resource metadata,
// which anyone may read.
func (g *gate) oauthOpen(r *http.Request) bool {
	if g.c.OAuth == nil || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return false
	}
	for _, p := range g.c.OAuth.MetadataPaths() {
		if r.URL.Path == p {
			return true
		}
	}
	return false
}

// challenge is the WWW-Authenticate value of a 401: with OAuth on, the
// Bearer challenge that sends a client to the metadata; without it,
// nothing that would start an OAuth client's discovery.
func (g *gate) challenge(tokenSent bool) string {
	if g.c.OAuth == nil {
		return `Bearer realm="mcp-quota"`
	}
	if tokenSent {
		return g.c.OAuth.Challenge("invalid_token", nil)
	}
	return g.c.OAuth.Challenge("", nil)
}

// oauthCaller checks r's bearer token as an OAuth access token, once it
// matched no static caller token. It returns the principal's caller; or
// it answers r itself and returns done: 401 for a token that is not valid
// here (the caller then counts it against the bad-token throttle: bad is
// true), 403 for a valid token of a principal mcp-quota does not know or
// without the scopes the request needs, 503 when the issuer cannot be
// asked.
func (g *gate) oauthCaller(w http.ResponseWriter, r *http.Request) (c *keystore.Caller, done, bad bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, false, false
	}
	p, err := g.c.OAuth.Verify(r.Context(), token)
	switch {
	case errors.Is(err, oauth.ErrInvalidToken):
		g.c.Log.Info("OAuth token refused", "reason", strings.TrimPrefix(err.Error(), oauth.ErrInvalidToken.Error()+": "), "remote", remoteIP(r))
		w.Header().Set("WWW-Authenticate", g.c.OAuth.Challenge("invalid_token", nil))
		rest.WriteProblem(w, http.StatusUnauthorized, rest.CodeUnauthorized,
			"The access token is not valid here: "+strings.TrimPrefix(err.Error(), oauth.ErrInvalidToken.Error()+": ")+".", nil)
		return nil, true, true
	case err != nil:
		g.c.Log.Warn("OAuth token cannot be checked", "err", err)
		w.Header().Set("Retry-After", "5")
		rest.WriteProblem(w, http.StatusServiceUnavailable, rest.CodeUpstreamUnavailable,
			"The access token cannot be checked now: the authorization server does not answer. Try again shortly.", nil)
		return nil, true, false
	}
	if need := g.c.OAuth.Scopes(); !p.HasScopes(need) {
		g.insufficientScope(w, need, "every request")
		return nil, true, false
	}
	c, err = g.c.Keys.Principal(p)
	if err != nil {
		rest.WriteProblem(w, http.StatusForbidden, codeUnknownPrincipal, strings.TrimPrefix(err.Error(), keystore.ErrUnknownPrincipal.Error()+": ")+".", nil)
		return nil, true, false
	}
	if need, what := g.scopesFor(r); !p.HasScopes(need) {
		g.insufficientScope(w, need, what)
		return nil, true, false
	}
	return c, false, false
}

// insufficientScope answers 403 with the step-up challenge: every scope
// the request needs, in one challenge.
func (g *gate) insufficientScope(w http.ResponseWriter, need []string, what string) {
	w.Header().Set("WWW-Authenticate", g.c.OAuth.Challenge("insufficient_scope", need))
	rest.WriteProblem(w, http.StatusForbidden, codeInsufficientScope,
		fmt.Sprintf("The access token lacks a scope %s needs: ask for %s.", what, strings.Join(need, " ")), nil)
}

// scopesFor returns the scopes r needs and what for: those of the key a
// REST path names (with its write scopes for a method other than GET and
// HEAD), or of the key an MCP tools/call names in its arguments (and its
// method). A request that names no key needs only the [oauth] scopes.
func (g *gate) scopesFor(r *http.Request) ([]string, string) {
	base := g.c.OAuth.Scopes()
	if rest, ok := strings.CutPrefix(r.URL.Path, "/k/"); ok {
		name, _, _ := strings.Cut(rest, "/")
		k, err := g.c.Keys.Key(name)
		if err != nil || name == "" {
			return base, "every request"
		}
		return g.c.Keys.NeedScopes(k, r.Method), fmt.Sprintf("key '%s' with %s", k.Name, r.Method)
	}
	if r.URL.Path != "/mcp" || r.Method != http.MethodPost || r.Body == nil {
		return base, "every request"
	}
	// Read the MCP message (the body limit stands before the MCP
	// server too) and put it back for the server.
	body, err := io.ReadAll(io.LimitReader(r.Body, g.c.MaxMCPBody+1))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
	if err != nil {
		return base, "every request"
	}
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Arguments struct {
				Key    string `json:"key"`
				Method string `json:"method"`
			} `json:"arguments"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" {
		return base, "every request"
	}
	k, err := g.c.Keys.Key(msg.Params.Arguments.Key)
	if err != nil {
		return base, "every request"
	}
	method := strings.ToUpper(msg.Params.Arguments.Method)
	if method == "" {
		method = http.MethodGet
	}
	return g.c.Keys.NeedScopes(k, method), fmt.Sprintf("key '%s' with %s", k.Name, method)
}

// signInReturn reports whether r is the authorization server sending a
// browser back to the dashboard's sign-in callback: a top-level GET
// navigation, cross-site by nature. The callback itself accepts it only
// with the state its own cookie holds.
func signInReturn(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Path == dashboard.CallbackPath &&
		r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Origin") == ""
}

// noTokenDetail is the 401's detail for a request without a token.
func (g *gate) noTokenDetail() string {
	if g.c.OAuth == nil {
		return "A caller token is required: send Authorization: Bearer <token> (a [[callers]] token from mcp-quota's configuration)."
	}
	return "A token is required: send Authorization: Bearer <token>, an OAuth access token for " + g.c.OAuth.Resource() +
		" (the WWW-Authenticate header names the metadata that says where to get one) or a [[callers]] token."
}
