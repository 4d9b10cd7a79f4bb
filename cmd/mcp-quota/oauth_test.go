package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/oidctest"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// oauthSetup is a configuration with key "demo" (whose writes need the
// scope demo:write), the static callers "agent" and "sync", an [oauth]
// table trusting issuer, and principals: alice by email, the sync job by
// client_id; the opaque job is known to nobody. It returns the setup and
// the address mcp-quota must listen on, the resource's.
func oauthSetup(t *testing.T, upstream, issuer string) (*setup, string) {
	t.Helper()
	// The resource names the port clients connect to: take a free one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := setupOf(t, oauthConfig(upstream, issuer, addr))
	s.env = append(s.env, "INTROSPECTION_SECRET=mcp-quota-secret")
	return s, addr
}

// oauthConfig is the configuration of oauthSetup, for the resource at
// addr: key "demo" of the upstream, whose writes need the scope
// demo:write, the static callers, the [oauth] table trusting issuer,
// and its principals.
func oauthConfig(upstream, issuer, addr string) testkit.Config {
	key := demoKey(upstream, 120, time.Minute)
	key.Methods, key.WriteScopes = []string{"GET", "POST"}, []string{"demo:write"}
	cfg := demoConfig(key)
	cfg.OAuth = &testkit.OAuth{Issuer: issuer, Resource: "http://" + addr + "/mcp", Scopes: []string{"mcp"},
		IntrospectionClientID: "mcp-quota", IntrospectionSecretEnv: "INTROSPECTION_SECRET", Contact: "the platform team"}
	cfg.Principals = []testkit.Principal{
		{Name: "alice@example.com", Claim: "email", Values: []string{"alice@example.com"}, Keys: []string{"demo"}},
		{Name: "nightly-sync", Claim: "client_id", Values: []string{"sync-job"}, Keys: []string{"demo"}},
	}
	return cfg
}

// oauthDo sends method to url with token and returns the answer and its body.
func oauthDo(t *testing.T, method, url, token string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// TestOAuthREST: a sync job's client-credentials token on the REST side,
// the protected resource metadata, each refusal with its challenge, and
// static tokens beside OAuth.
func TestOAuthREST(t *testing.T) {
	iss := oidctest.Start(t, 2, "alice")
	api, upstream := upstreamAPI(t, demo.Config{})
	s, addr := oauthSetup(t, upstream, iss[0])
	base, logs := s.serve(t, "--listen", "127.0.0.1:"+strings.Split(addr, ":")[1])
	resource := base + "/mcp"
	metadataURL := base + "/.well-known/oauth-protected-resource/mcp"

	// The metadata, at both well-known URIs.
	for _, path := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"} {
		resp, body := oauthDo(t, http.MethodGet, base+path, "")
		var md struct {
			Resource             string   `json:"resource"`
			AuthorizationServers []string `json:"authorization_servers"`
			Scopes               []string `json:"scopes_supported"`
		}
		if err := json.Unmarshal([]byte(body), &md); resp.StatusCode != http.StatusOK || err != nil {
			t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		if md.Resource != resource || len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != iss[0] ||
			strings.Join(md.Scopes, " ") != "demo:write mcp" {
			t.Errorf("GET %s = %+v", path, md)
		}
	}

	// No token: 401 pointing at the metadata, with the scope to ask for.
	resp, _ := oauthDo(t, http.MethodGet, base+"/k/demo/v1/participants", "")
	if want := `Bearer resource_metadata="` + metadataURL + `", scope="mcp"`; resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != want {
		t.Errorf("no token: %d %q, want 401 %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), want)
	}

	// The sync job's client-credentials JWT reads through key demo.
	sync := oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", resource, "mcp")
	resp, body := oauthDo(t, http.MethodGet, base+"/k/demo/v1/participants", sync)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("client-credentials token: %d %s", resp.StatusCode, body)
	}
	if n := len(api.Stats(upstreamSecret).Accepted); n != 1 {
		t.Errorf("the upstream accepted %d calls with the key's secret, want 1", n)
	}
	acts := readActivity(t, base, sync)
	if len(acts) != 1 || acts[0].Caller != "nightly-sync" {
		t.Errorf("activity = %+v, want one call by nightly-sync", acts)
	}

	// /v1/quota and /metrics name the principal.
	resp, body = oauthDo(t, http.MethodGet, base+"/v1/quota", sync)
	var st struct{ Caller string }
	if err := json.Unmarshal([]byte(body), &st); err != nil || resp.StatusCode != http.StatusOK || st.Caller != "nightly-sync" {
		t.Errorf("GET /v1/quota: %d %s, want it for nightly-sync", resp.StatusCode, body)
	}
	named := false
	for _, m := range scrape(t, base, sync)["mcp_quota_calls_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			named = named || (l.GetName() == "caller" && l.GetValue() == "nightly-sync")
		}
	}
	if !named {
		t.Error("/metrics has no calls of caller nightly-sync")
	}

	// A write needs demo:write: 403 with the step-up challenge naming
	// every scope the call needs.
	resp, body = oauthDo(t, http.MethodPost, base+"/k/demo/v1/participants", sync)
	want := `Bearer resource_metadata="` + metadataURL + `", error="insufficient_scope", scope="demo:write mcp"`
	if resp.StatusCode != 403 || resp.Header.Get("WWW-Authenticate") != want || !strings.Contains(body, "insufficientScope") {
		t.Errorf("write without its scope: %d %q %s, want 403 %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body, want)
	}
	// The same over MCP: a tools/call of fetch with POST on key demo.
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fetch","arguments":{"key":"demo","path":"/v1/participants","method":"post"}}}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/mcp", strings.NewReader(call))
	req.Header.Set("Authorization", "Bearer "+sync)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mresp.Body.Close()
	if mresp.StatusCode != 403 || mresp.Header.Get("WWW-Authenticate") != want {
		t.Errorf("MCP fetch with POST without its scope: %d %q, want 403 %q", mresp.StatusCode, mresp.Header.Get("WWW-Authenticate"), want)
	}
	writer := oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", resource, "mcp demo:write")
	if resp, body := oauthDo(t, http.MethodPost, base+"/k/demo/v1/participants", writer); resp.StatusCode == 403 || resp.StatusCode == 401 {
		t.Errorf("write with its scope: %d %s", resp.StatusCode, body)
	}

	// A token without the scope every request needs: 403 step-up.
	bare := oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", resource, "demo:write")
	resp, _ = oauthDo(t, http.MethodGet, base+"/v1/quota", bare)
	if want := `Bearer resource_metadata="` + metadataURL + `", error="insufficient_scope", scope="mcp"`; resp.StatusCode != 403 || resp.Header.Get("WWW-Authenticate") != want {
		t.Errorf("token without mcp: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}

	// A valid (introspected) token of a principal nobody configured: 403
	// that says whom to ask for what.
	opaque := oidctest.ClientCredentials(t, iss[0], "opaque-job", "opaque-job-secret", resource, "mcp")
	resp, body = oauthDo(t, http.MethodGet, base+"/v1/quota", opaque)
	if resp.StatusCode != 403 || !strings.Contains(body, "unknownPrincipal") || !strings.Contains(body, "the platform team") || !strings.Contains(body, "[[principals]]") {
		t.Errorf("unknown principal: %d %s", resp.StatusCode, body)
	}

	// Invalid tokens: 401 invalid_token, each named why.
	other := oidctest.ClientCredentials(t, iss[1], "sync-job", "sync-job-secret", resource, "mcp")
	wrongAud := oidctest.ClientCredentials(t, iss[0], "sync-job", "sync-job-secret", "http://127.0.0.1:1/mcp", "mcp")
	for name, tc := range map[string]struct{ token, why string }{
		"wrong issuer":   {other, "not trusted"},
		"wrong audience": {wrongAud, "not issued for this resource"},
	} {
		resp, body := oauthDo(t, http.MethodGet, base+"/v1/quota", tc.token)
		want := `Bearer resource_metadata="` + metadataURL + `", error="invalid_token", scope="mcp"`
		if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != want || !strings.Contains(body, tc.why) {
			t.Errorf("%s: %d %q %s", name, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
		}
	}

	// An MCP session the sync job opened with its token is the
	// principal's: a static caller naming it gets the 404 of an unknown
	// session; the job itself goes on using it.
	client := gomcp.NewClient(&gomcp.Implementation{Name: "nightly-sync", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{sync, http.DefaultTransport}}, MaxRetries: -1},
		&gomcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if sess.ID() == "" {
		t.Fatal("no MCP session was opened")
	}
	r, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/mcp",
		strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"quota_status","arguments":{}}}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Authorization", "Bearer "+agentToken)
	r.Header.Set("Mcp-Session-Id", sess.ID())
	r.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if resp, err := http.DefaultClient.Do(r); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("another caller in the principal's session: %d, want 404", resp.StatusCode)
	}
	if err := sess.Ping(t.Context(), nil); err != nil {
		t.Errorf("the principal's own session after another caller's try: %v", err)
	}

	// Static caller tokens work beside OAuth, as before.
	if resp, body := oauthDo(t, http.MethodGet, base+"/v1/quota", agentToken); resp.StatusCode != http.StatusOK {
		t.Errorf("static token beside OAuth: %d %s", resp.StatusCode, body)
	}

	// Bad OAuth tokens cost the bad-token throttle like bad static ones.
	throttled := false
	for i := range 30 {
		parts := strings.Split(wrongAud, ".")
		parts[2] = fmt.Sprintf("forged%d", i)
		if resp, _ := oauthDo(t, http.MethodGet, base+"/v1/quota", strings.Join(parts, ".")); resp.StatusCode == http.StatusTooManyRequests {
			throttled = true
			break
		}
	}
	if !throttled {
		t.Error("30 bad OAuth tokens from one address were never throttled")
	}

	// No token reaches the logs or the upstream.
	for _, tok := range []string{sync, writer, opaque, other, wrongAud, bare} {
		if strings.Contains(logs.String(), tok) {
			t.Error("the server's log contains an access token")
		}
		if len(api.Stats(tok).Accepted) != 0 {
			t.Error("the upstream saw an access token")
		}
	}
}

// TestNoOAuthDiscoveryWithoutConfig: without [oauth], nothing of OAuth is
// published — no metadata, no resource_metadata in a challenge — so
// clients that start OAuth on discovery keep using their static header.
func TestNoOAuthDiscoveryWithoutConfig(t *testing.T) {
	_, upstream := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(upstream, 120, time.Minute))
	base, _ := s.serve(t)
	for _, path := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"} {
		for _, token := range []string{"", agentToken} {
			resp, body := oauthDo(t, http.MethodGet, base+path, token)
			if resp.StatusCode == http.StatusOK || strings.Contains(body, "authorization_servers") {
				t.Errorf("GET %s (token %v): %d %s", path, token != "", resp.StatusCode, body)
			}
		}
	}
	resp, _ := oauthDo(t, http.MethodPost, base+"/mcp", "")
	if h := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != 401 || strings.Contains(h, "resource_metadata") || strings.Contains(h, "scope") {
		t.Errorf("POST /mcp without a token: %d %q", resp.StatusCode, h)
	}
	if resp, body := oauthDo(t, http.MethodGet, base+"/v1/quota", agentToken); resp.StatusCode != http.StatusOK {
		t.Errorf("static token: %d %s", resp.StatusCode, body)
	}
}

// TestOAuthTypeScriptClient: the official TypeScript SDK client's own
// OAuth flow, end to end against a real authorization server: 401,
// discovery, dynamic registration, authorization code + PKCE with the
// resource, then fetch and quota_status with the token it got.
func TestOAuthTypeScriptClient(t *testing.T) {
	node, script := tsClient(t)
	iss := oidctest.Start(t, 1, "alice")
	_, upstream := upstreamAPI(t, demo.Config{})
	s, addr := oauthSetup(t, upstream, iss[0])
	base, logs := s.serve(t, "--listen", addr)

	calls := []tsCall{
		{Name: "fetch", Tool: "fetch", Args: map[string]any{"key": "demo", "path": "/v1/participants"}},
		{Name: "status", Tool: "quota_status", Args: map[string]any{"key": "demo"}},
	}
	file := filepath.Join(t.TempDir(), "calls.json")
	raw, _ := json.Marshal(calls)
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), node, filepath.Join(filepath.Dir(script), "oauth.mjs"), file)
	cmd.Env = append(os.Environ(), "MCP_URL="+base+"/mcp")
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v\nstderr:\n%s\nserver:\n%s", err, stderr.String(), logs.String())
	}
	var got struct {
		Registered string
		Scope      string
		Resource   string
		Answers    []struct {
			tsAnswer
			Caller string
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got.Registered == "" || got.Resource != base+"/mcp" || !strings.Contains(got.Scope, "mcp") {
		t.Errorf("flow: registered %q, resource %q, scope %q", got.Registered, got.Resource, got.Scope)
	}
	if len(got.Answers) != 2 {
		t.Fatalf("answers: %+v", got.Answers)
	}
	for _, a := range got.Answers {
		if a.ProtocolError != nil || a.IsError || !a.Structured {
			t.Errorf("%s: %+v", a.Name, a)
		}
	}
	if c := got.Answers[1].Caller; c != "alice@example.com via "+got.Registered {
		t.Errorf("quota_status is for %q, want alice@example.com via %s", c, got.Registered)
	}
	// The activity names the person and the client she came through.
	acts := readActivity(t, base, agentToken)
	if len(acts) != 1 || acts[0].Caller != "alice@example.com via "+got.Registered {
		t.Errorf("activity = %+v, want one call by alice@example.com via %s", acts, got.Registered)
	}
}

// registerDashboard registers the dashboard of a serve process at addr
// as a public client of issuer, for the authorization code flow, and
// returns its client ID.
func registerDashboard(t *testing.T, issuer, addr string) string {
	t.Helper()
	callback := "http://" + addr + "/ui/signin/callback"
	reg, _ := json.Marshal(map[string]any{"redirect_uris": []string{callback}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code"}, "response_types": []string{"code"}, "client_name": "mcp-quota dashboard"})
	resp, err := http.Post(issuer+"/reg", "application/json", strings.NewReader(string(reg)))
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	json.NewDecoder(resp.Body).Decode(&client)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || client.ClientID == "" {
		t.Fatalf("registering the dashboard: %s", resp.Status)
	}
	return client.ClientID
}

// TestDashboardOAuthSignIn: a person signs in to the dashboard with the
// authorization server (authorization code + PKCE), beside the token
// sign-in; a member of the admin group sees every key.
func TestDashboardOAuthSignIn(t *testing.T) {
	iss := oidctest.Start(t, 1, "alice")
	_, upstream := upstreamAPI(t, demo.Config{})
	s, addr := oauthSetup(t, upstream, iss[0])
	clientID := registerDashboard(t, iss[0], addr)
	// Alice's group team-a is the admin group: she may see every key.
	cfg := oauthConfig(upstream, iss[0], addr)
	cfg.OAuth.DashboardClientID, cfg.OAuth.AdminGroup = clientID, "team-a"
	s.write(t, cfg)
	base, logs := s.serve(t, "--listen", addr)

	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Transport: crossSiteReturn{}}
	resp, err := browser.Get(base + "/ui/signin/oidc")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.String() != base+"/" {
		t.Fatalf("the sign-in ended at %s with %s\n%s", resp.Request.URL, resp.Status, logs.String())
	}
	resp, err = browser.Get(base + "/ui/api/session")
	if err != nil {
		t.Fatal(err)
	}
	var who struct {
		Caller   string   `json:"caller"`
		Keys     []string `json:"keys"`
		SignedIn bool     `json:"signed_in"`
	}
	json.NewDecoder(resp.Body).Decode(&who)
	resp.Body.Close()
	if !who.SignedIn || who.Caller != "alice@example.com via "+clientID || len(who.Keys) != 1 || who.Keys[0] != "demo" {
		t.Errorf("signed in as %+v", who)
	}

	// A return to the callback that this browser did not start is refused.
	resp, err = http.Get(base + "/ui/signin/callback?code=x&state=y")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a callback without its state cookie: %s", resp.Status)
	}
}

// crossSiteReturn marks the return to the sign-in callback as a browser
// does: a cross-site top-level navigation.
type crossSiteReturn struct{}

func (crossSiteReturn) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/ui/signin/callback" {
		r = r.Clone(r.Context())
		r.Header.Set("Sec-Fetch-Site", "cross-site")
		r.Header.Set("Sec-Fetch-Mode", "navigate")
	}
	return http.DefaultTransport.RoundTrip(r)
}
