package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/rest"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/tools"
	"github.com/mcp-quota/mcp-quota/upstream"
)

const (
	fleetUpstreamSecret = "sk-live-FLEET-UPSTREAM-3c8e1a6f0b"
	fleetToken          = "caller-FLEET-token-7a2d9f4c1e"
	fleetOtherToken     = "caller-OTHER-token-5e8b1d3a9c"
)

// fleet is mcp-quota's HTTP side on several hosts, each wired as
// `mcp-quota serve` wires one — its own state handle, pacer, upstream
// client, REST handler, MCP tools and gateway — sharing one state file,
// one upstream (the demo API, 120 calls a minute) and one clock.
type fleet struct {
	t     *testing.T
	keys  *keystore.Store
	path  string
	clock *testkit.Clock

	maxSessionsPerCaller int // of the hosts started next; 0 means the default
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	api := httptest.NewServer(demo.New(demo.Config{Tokens: []string{fleetUpstreamSecret}}))
	t.Cleanup(api.Close)
	cfg := testkit.Config{
		Keys: []testkit.Key{{Name: "demo", BaseURL: api.URL, SecretEnv: "UPSTREAM_SECRET", Auth: "bearer", Profile: "ietf", MaxRate: 1000,
			Policies: []testkit.Policy{{Name: "default", Quota: 120, Window: time.Minute}}}},
		Callers: []testkit.Caller{
			{Name: "agent", TokenEnv: "AGENT_TOKEN", Keys: []string{"demo"}},
			{Name: "other", TokenEnv: "OTHER_TOKEN", Keys: []string{"demo"}},
		},
	}.TOML()
	env := map[string]string{"UPSTREAM_SECRET": fleetUpstreamSecret, "AGENT_TOKEN": fleetToken, "OTHER_TOKEN": fleetOtherToken}
	keys, err := keystore.Parse([]byte(cfg), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, keys: keys, path: testkit.StateFile(t, state.Open), clock: testkit.NewClock(time.Now())}
}

// host starts one more host whose sessions are signed with secret ("":
// none given) and returns its base URL.
func (f *fleet) host(secret string) string {
	f.t.Helper()
	db, err := state.Open(f.t.Context(), f.path)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { db.Close() })
	p := pacer.New(db)
	client := upstream.New(p, nil)
	mcp := tools.NewServer(&tools.Deps{Keys: f.keys, Client: client, Pacer: p, DB: db, Transport: "mcp-http", Clock: f.clock}, "test")
	c := Config{Keys: f.keys, REST: &rest.Handler{Keys: f.keys, Client: client, Pacer: p, DB: db}, MCP: mcp, DB: db,
		Loopback: true, SessionIdle: time.Hour, Clock: f.clock, MaxSessionsPerCaller: f.maxSessionsPerCaller}
	if secret != "" {
		c.SessionSecret = keystore.NewSecret(secret)
	}
	srv := httptest.NewServer(New(c))
	f.t.Cleanup(srv.Close) // before the state handle closes
	return srv.URL
}

// exchange is one request a client sent and the status it got.
type exchange struct {
	host    int
	method  string
	session string
	status  int
}

// alternating is an http.RoundTripper that sends each request to the
// next of its hosts in turn, as a load balancer without stickiness
// would, with the caller's token, and records what it sent.
type alternating struct {
	hosts []string // host:port
	mu    sync.Mutex
	next  int
	sent  []exchange
}

func (a *alternating) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	i := a.next % len(a.hosts)
	a.next++
	a.mu.Unlock()
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = a.hosts[i], a.hosts[i]
	r.Header.Set("Authorization", "Bearer "+fleetToken)
	resp, err := http.DefaultTransport.RoundTrip(r)
	e := exchange{host: i, method: r.Method, session: r.Header.Get("Mcp-Session-Id")}
	if err == nil {
		e.status = resp.StatusCode
	}
	a.mu.Lock()
	a.sent = append(a.sent, e)
	a.mu.Unlock()
	return resp, err
}

func hostOf(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestLegacySessionAlternatingHosts: the official Go SDK's client, on
// the initialize handshake of 2025-11-25, whose every request goes to the
// other of two hosts that share the session secret and the state: the
// handshake, tool lists, tool calls and pings all succeed, on both hosts,
// in one session, and the calls spend one shared budget.
func TestLegacySessionAlternatingHosts(t *testing.T) {
	f := newFleet(t)
	a, b := f.host(sharedSecret), f.host(sharedSecret)
	lb := &alternating{hosts: []string{hostOf(t, a), hostOf(t, b)}}
	client := gomcp.NewClient(&gomcp.Implementation{Name: "legacy", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: a + "/mcp",
		HTTPClient: &http.Client{Transport: lb}, MaxRetries: -1}, &gomcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { sess.Close() }) // before the hosts close: its event stream is open
	if v := sess.InitializeResult().ProtocolVersion; v != "2025-11-25" {
		t.Fatalf("negotiated %q, want the handshake's 2025-11-25", v)
	}
	var lists []string
	for range 2 {
		l, err := sess.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		if len(l.Tools) != 2 {
			t.Errorf("tools: %d, want fetch and quota_status", len(l.Tools))
		}
		j, _ := json.MarshalIndent(l, "", "  ")
		lists = append(lists, string(j))
	}
	if d := cmp.Diff(lists[0], lists[1]); d != "" {
		t.Errorf("the hosts list other tools (-first +second):\n%s", d)
	}
	for i := range 5 {
		res, err := sess.CallTool(t.Context(), &gomcp.CallToolParams{Name: "fetch",
			Arguments: map[string]any{"key": "demo", "path": "/v1/participants/p-000001"}})
		if err != nil || res.IsError {
			t.Fatalf("fetch %d: %v %+v", i+1, err, res)
		}
		var out struct{ Quota struct{ Remaining int } }
		raw, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(raw, &out); err != nil || out.Quota.Remaining != 119-i {
			t.Errorf("fetch %d: remaining %d (%v), want %d: one budget over both hosts", i+1, out.Quota.Remaining, err, 119-i)
		}
	}
	for range 2 {
		if err := sess.Ping(t.Context(), nil); err != nil {
			t.Errorf("ping: %v", err)
		}
	}
	id := sess.ID()
	if err := sess.Close(); err != nil {
		t.Errorf("close: %v", err)
	}

	served := map[int]int{}
	lb.mu.Lock()
	for _, e := range lb.sent {
		if e.session != "" && e.session != id {
			t.Errorf("%s to host %d named session %q, not %q", e.method, e.host, e.session, id)
		}
		if e.status >= 300 {
			t.Errorf("%s to host %d: %d", e.method, e.host, e.status)
		}
		if e.session != "" && e.method == "POST" {
			served[e.host]++
		}
	}
	lb.mu.Unlock()
	if served[0] < 4 || served[1] < 4 {
		t.Errorf("requests in the session served by each host: %v, want several by both", served)
	}
}

// post sends an MCP message to base/mcp in session id and returns the
// answer, its body read.
func post(t *testing.T, base, id, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "POST", base+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+fleetToken)
	if id != "" {
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestAdoptedSessionAnswersAlike: a host that never saw a session's
// initialize answers each request in it as the host that opened it does —
// the same status, header fields and body — and a host with another
// secret answers 404, saying to start a new session.
func TestAdoptedSessionAnswersAlike(t *testing.T) {
	f := newFleet(t)
	a, b, other := f.host(sharedSecret), f.host(sharedSecret), f.host(otherSecret)
	resp, body := post(t, a, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" || !strings.Contains(body, `"protocolVersion":"2025-11-25"`) {
		t.Fatalf("initialize: %d, session %q: %s", resp.StatusCode, id, body)
	}
	for _, msg := range []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"quota_status","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"resources/templates/list"}`,
		`{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"quota://activity/demo"}}`,
		`{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"quota://activity/nope"}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"no_such_tool","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":8,"method":"logging/setLevel","params":{"level":"info"}}`,
		`{"jsonrpc":"2.0","id":9,"method":"ping"}`,
	} {
		ra, ba := post(t, a, id, msg)
		rb, bb := post(t, b, id, msg)
		ha, hb := ra.Header.Clone(), rb.Header.Clone()
		ha.Del("Date")
		hb.Del("Date")
		if ra.StatusCode != rb.StatusCode || ra.StatusCode >= 300 || !cmp.Equal(ha, hb) || ba != bb {
			t.Errorf("%s:\nfirst host:  %d %v %s\nsecond host: %d %v %s", msg, ra.StatusCode, ha, ba, rb.StatusCode, hb, bb)
		}
	}
	resp, body = post(t, other, id, `{"jsonrpc":"2.0","id":10,"method":"ping"}`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "Start a new one with initialize, without Mcp-Session-Id") {
		t.Errorf("ping on a host with another secret: %d %s", resp.StatusCode, body)
	}
}
