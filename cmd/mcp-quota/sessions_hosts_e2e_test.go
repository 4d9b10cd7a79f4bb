package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/internal/pgtest"
)

// TestLegacySessionAcrossHosts: a client of the initialize handshake
// (the official Go SDK's, at 2025-11-25) behind a load balancer that sends
// each request to the other of two `serve` hosts sharing one PostgreSQL
// state: the session opened on one host is served by the other, since
// both sign session IDs with the key the database keeps, and the calls on
// either host spend one budget.
func TestLegacySessionAcrossHosts(t *testing.T) {
	srv := pgtest.Start(t)
	_, upstreamURL := upstreamAPI(t, demo.Config{})
	s := newSetup(t, demoKey(upstreamURL, 120, time.Minute))
	s.state = srv.CreateDatabase(t)
	s.env = append(s.env, "PGPASSWORD="+srv.Password(), "XDG_STATE_HOME="+t.TempDir())
	var hosts []string
	for range 2 {
		_, base, stderr := s.serveProcess(t)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("serve %s:\n%s", base, stderr.String())
			}
		})
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		hosts = append(hosts, u.Host)
	}
	lb := &balancer{hosts: hosts, token: syncToken}
	client := gomcp.NewClient(&gomcp.Implementation{Name: "behind-a-balancer", Version: "1"}, nil)
	sess, err := client.Connect(t.Context(), &gomcp.StreamableClientTransport{Endpoint: "http://" + hosts[0] + "/mcp",
		HTTPClient: &http.Client{Transport: lb}, MaxRetries: -1}, &gomcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("initialize through the balancer: %v", err)
	}
	t.Cleanup(func() { sess.Close() }) // before the hosts end: its event stream is open
	if sess.ID() == "" {
		t.Fatalf("the handshake (%s) opened no session", sess.InitializeResult().ProtocolVersion)
	}
	for range 2 {
		if list, err := sess.ListTools(t.Context(), nil); err != nil || len(list.Tools) != 2 {
			t.Fatalf("tools/list: %v, %v", list, err)
		}
	}
	for i := range 6 {
		res, out := call(t, sess, "fetch", map[string]any{"key": "demo", "path": fmt.Sprintf("/v1/participants/p-%06d", i+1)})
		if res.IsError {
			t.Fatalf("fetch %d: %s", i, text(res))
		}
		if out["status"] != float64(200) {
			t.Fatalf("fetch %d: status %v, want 200", i, out["status"])
		}
	}
	if err := sess.Ping(t.Context(), nil); err != nil {
		t.Fatalf("ping: %v", err)
	}
	_, st := call(t, sess, "quota_status", map[string]any{"key": "demo"})
	used := usedOf(t, st)
	if used != 6 {
		t.Errorf("quota_status counts %d calls of the key, want the 6 made through both hosts", used)
	}
	for i, n := range lb.byHost() {
		if n < 4 {
			t.Errorf("host %d got %d requests of the session, want about half of them", i, n)
		}
	}
	if n := lb.refused(); n > 0 {
		t.Errorf("%d requests were answered 404 (the session not known on that host)", n)
	}
	// The session is the sync job's: the agent, holding its ID, gets on
	// either host the 404 of a session never opened, and ends nothing.
	for _, host := range hosts {
		for _, req := range []struct{ method, body string }{
			{"POST", `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"quota_status","arguments":{}}}`},
			{"POST", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`},
			{"DELETE", ""},
		} {
			r, _ := http.NewRequestWithContext(t.Context(), req.method, "http://"+host+"/mcp", strings.NewReader(req.body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Accept", "application/json, text/event-stream")
			r.Header.Set("Authorization", "Bearer "+agentToken)
			r.Header.Set("Mcp-Session-Id", sess.ID())
			r.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("another caller's %s in the session on %s: %d, want 404", req.method, host, resp.StatusCode)
			}
		}
	}
	if err := sess.Ping(t.Context(), nil); err != nil {
		t.Errorf("ping after another caller's tries: %v", err)
	}
}

// usedOf returns the calls a quota_status of one key counts in its
// local (documented) window.
func usedOf(t *testing.T, st map[string]any) int {
	t.Helper()
	keys, _ := st["keys"].([]any)
	if len(keys) != 1 {
		t.Fatalf("quota_status: %v, want one key", st)
	}
	local, _ := keys[0].(map[string]any)["local"].([]any)
	if len(local) == 0 {
		t.Fatalf("quota_status: %v, want its local budget", st)
	}
	used, _ := local[0].(map[string]any)["used"].(float64)
	return int(used)
}

// balancer sends each request to the next of hosts in turn, as a
// round-robin load balancer without stickiness does.
type balancer struct {
	hosts []string
	token string

	mu     sync.Mutex
	next   int
	counts map[int]int
	nf     int // answers 404
}

func (b *balancer) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := b.next % len(b.hosts)
	b.next++
	if b.counts == nil {
		b.counts = map[int]int{}
	}
	b.counts[i]++
	b.mu.Unlock()
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = b.hosts[i], b.hosts[i]
	r.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusNotFound && strings.Contains(r.URL.Path, "/mcp") {
		b.mu.Lock()
		b.nf++
		b.mu.Unlock()
	}
	return resp, err
}

func (b *balancer) byHost() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]int, len(b.hosts))
	for i, n := range b.counts {
		out[i] = n
	}
	return out
}

func (b *balancer) refused() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nf
}
