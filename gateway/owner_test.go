package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/keystore"
)

// bearer is an http.RoundTripper that sends every request with token.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens a session on base/mcp with the official Go SDK's client,
// at the initialize handshake of 2025-11-25, as the caller of token.
func connect(t *testing.T, base, token string) (*gomcp.ClientSession, error) {
	t.Helper()
	client := gomcp.NewClient(&gomcp.Implementation{Name: "owner", Version: "1"}, nil)
	return client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: base + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{token}}, MaxRetries: -1}, &gomcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
}

// raw sends one request to base/mcp in session id as the caller of token
// and returns its status and body.
func raw(t *testing.T, method, base, id, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, base+"/mcp", strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && resp.Header.Get("Content-Type") == "text/event-stream" && method == "GET" {
		return resp.StatusCode, "(an event stream)" // it would not end
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestSessionBelongsToItsCaller: caller A opens a session with the
// official Go SDK's client on one of two hosts sharing the session
// secret; caller B, holding A's session ID, can neither call a tool in
// it, nor cancel A's requests, nor open its event stream, nor end it —
// on the host that opened it or on the other — and learns nothing: each
// answer is exactly what a session never opened gets. A's session goes
// on, on both hosts.
func TestSessionBelongsToItsCaller(t *testing.T) {
	f := newFleet(t)
	a, b := f.host(sharedSecret), f.host(sharedSecret)
	sess, err := connect(t, a, fleetToken)
	if err != nil {
		t.Fatalf("connect as A: %v", err)
	}
	t.Cleanup(func() { sess.Close() })
	id := sess.ID()
	if id == "" {
		t.Fatal("the handshake opened no session")
	}
	// A well-formed ID of a session never opened: one of another secret.
	never := newSessionIDs(keystore.NewSecret(otherSecret)).issue(f.clock.Now(), "other")
	const (
		call   = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"quota_status","arguments":{}}}`
		cancel = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"B says so"}}`
	)
	for _, host := range []struct{ name, base string }{{"the host that opened it", a}, {"the other host", b}} {
		for _, req := range []struct{ method, body string }{{"POST", call}, {"POST", cancel}, {"GET", ""}, {"DELETE", ""}} {
			wantStatus, wantBody := raw(t, req.method, host.base, never, fleetOtherToken, req.body)
			if wantStatus != http.StatusNotFound {
				t.Fatalf("%s %s in a session never opened: %d, want 404: %s", host.name, req.method, wantStatus, wantBody)
			}
			status, body := raw(t, req.method, host.base, id, fleetOtherToken, req.body)
			if status != wantStatus || body != wantBody {
				t.Errorf("%s: B's %s %.40s in A's session: %d %q; want what an unknown session gets, %d %q",
					host.name, req.method, req.body, status, body, wantStatus, wantBody)
			}
		}
	}
	// A's session lives on, on both hosts, after all of B's tries.
	if _, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "quota_status", Arguments: map[string]any{}}); err != nil {
		t.Errorf("A's call after B's tries: %v", err)
	}
	if status, body := raw(t, "POST", b, id, fleetToken, `{"jsonrpc":"2.0","id":8,"method":"ping"}`); status != http.StatusOK {
		t.Errorf("A's ping on the other host: %d %s", status, body)
	}
	if err := sess.Close(); err != nil {
		t.Errorf("A's DELETE: %v", err)
	}
}

// TestSessionBoundReachesClient: past a caller's bound, the official Go
// SDK's client fails to connect with mcp-quota's sentence, which says
// what to do; other callers still connect, and an ended session makes
// room again.
func TestSessionBoundReachesClient(t *testing.T) {
	f := newFleet(t)
	f.maxSessionsPerCaller = 2
	a := f.host(sharedSecret)
	var open []*gomcp.ClientSession
	for range 2 {
		s, err := connect(t, a, fleetToken)
		if err != nil {
			t.Fatalf("connect within the bound: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		open = append(open, s)
	}
	_, err := connect(t, a, fleetToken)
	if err == nil || !strings.Contains(err.Error(), "Caller 'agent' has 2 MCP sessions open") ||
		!strings.Contains(err.Error(), "disconnect") {
		t.Fatalf("connect past the bound: %v; want the bound's sentence", err)
	}
	other, err := connect(t, a, fleetOtherToken)
	if err != nil {
		t.Fatalf("another caller's connect: %v", err)
	}
	other.Close()
	if err := open[0].Close(); err != nil {
		t.Fatal(err)
	}
	again, err := connect(t, a, fleetToken)
	if err != nil {
		t.Fatalf("connect after one session ended: %v", err)
	}
	again.Close()
}
