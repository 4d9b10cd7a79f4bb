package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// hosts returns MCP sides of as many hosts as secrets, on one clock.
func hosts(t *testing.T, idle time.Duration, secrets ...string) ([]*mcpSide, *testkit.Clock) {
	t.Helper()
	c := testkit.NewClock(t0)
	var hs []*mcpSide
	for _, s := range secrets {
		secret := keystore.Secret{}
		if s != "" {
			secret = keystore.NewSecret(s)
		}
		hs = append(hs, newMCPHost(t, idle, secret, c))
	}
	return hs, c
}

// TestSessionRefusedElsewhere: a session opened on one host is served by
// another with the same secret, and answered like an unknown session —
// the same 404, the same sentence — by a host with another secret or
// none, and everywhere when its ID was altered.
func TestSessionRefusedElsewhere(t *testing.T) {
	hs, _ := hosts(t, time.Minute, sharedSecret, sharedSecret, otherSecret, "")
	a, b, other, none := hs[0], hs[1], hs[2], hs[3]
	id := a.open(t)
	if got := b.ping(id); got != http.StatusOK {
		t.Fatalf("ping on a host with the same secret: %d, want 200", got)
	}
	unknown := a.do("POST", "no-such-session", `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if unknown.Code != http.StatusNotFound || !strings.Contains(unknown.Body.String(), "Start a new one with initialize") {
		t.Fatalf("an unknown session: %d %q", unknown.Code, unknown.Body)
	}
	tampered := reencode(t, id, func(b []byte) { b[12] ^= 4 })
	for _, tt := range []struct {
		name string
		host *mcpSide
		id   string
	}{
		{"another secret", other, id},
		{"no shared secret", none, id},
		{"altered, on the host that opened it", a, tampered},
		{"altered, elsewhere", b, tampered},
		{"altered, never seen", other, tampered},
	} {
		for _, method := range []string{"POST", "GET", "DELETE"} {
			body := ""
			if method == "POST" {
				body = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
			}
			w := tt.host.do(method, tt.id, body)
			if w.Code != unknown.Code || w.Body.String() != unknown.Body.String() {
				t.Errorf("%s, %s: %d %q; want what an unknown session gets", tt.name, method, w.Code, w.Body)
			}
		}
	}
	if n := other.ss.count() + none.ss.count(); n != 0 {
		t.Errorf("the hosts that refused it keep %d sessions", n)
	}
	if got := a.ping(id); got != http.StatusOK {
		t.Errorf("the session itself on its host after the refusals: %d", got)
	}
}

// TestSessionIdlesPerHost: each host ends a session once it has been
// idle there, however busy it is on another; a host never takes up again
// a session that ended there, while one that never saw it does, until
// SessionMaxAge; what a host keeps of its ended sessions goes then too.
func TestSessionIdlesPerHost(t *testing.T) {
	hs, c := hosts(t, time.Minute, sharedSecret, sharedSecret, sharedSecret, sharedSecret)
	a, b, fresh, later := hs[0], hs[1], hs[2], hs[3]
	id := a.open(t)
	if got := b.ping(id); got != http.StatusOK {
		t.Fatalf("ping on the second host: %d", got)
	}
	if a.ss.count() != 1 || b.ss.count() != 1 {
		t.Fatalf("sessions live: %d and %d, want 1 on each host", a.ss.count(), b.ss.count())
	}
	// mcp-go registered the session where it saw initialize, and answers
	// on the other host all the same.
	if a.registered.Load() != 1 || b.registered.Load() != 0 {
		t.Errorf("registered in mcp-go: %d and %d, want 1 and 0", a.registered.Load(), b.registered.Load())
	}
	c.Advance(40 * time.Second)
	if got := a.ping(id); got != http.StatusOK {
		t.Fatalf("ping on the first host at 40 s: %d", got)
	}
	c.Advance(40 * time.Second)
	if got := b.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on the second host after 80 s idle there: %d, want 404", got)
	}
	if got := a.ping(id); got != http.StatusOK {
		t.Errorf("ping on the first host after 40 s idle there: %d, want 200", got)
	}
	if got := b.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on the second host again: %d; a session that ended there must stay ended", got)
	}
	c.Advance(2 * time.Minute)
	if got := a.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on the first host after 2 min idle: %d, want 404", got)
	}
	if a.ss.count() != 0 || a.registered.Load() != 0 {
		t.Errorf("the first host keeps %d sessions, %d in mcp-go", a.ss.count(), a.registered.Load())
	}
	// The limit of keeping no shared record: a host that never saw the
	// session takes it up.
	if got := fresh.ping(id); got != http.StatusOK {
		t.Errorf("ping on a host that never saw the session: %d, want 200", got)
	}
	c.Advance(SessionMaxAge)
	if got := later.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on a host that never saw it, %s after it began: %d, want 404", SessionMaxAge, got)
	}
	// Not the host's session count: its record of the ended ones.
	for _, h := range []*mcpSide{a, b} {
		h.ss.sweep()
		h.ss.mu.Lock()
		if n := len(h.ss.ended); n != 0 {
			t.Errorf("%d ended sessions remembered past their IDs' age", n)
		}
		h.ss.mu.Unlock()
	}
}

// TestDeleteEndsSessionOnItsHost: DELETE ends a session on the host that
// gets it, for good; another host serves it until it idles out there.
func TestDeleteEndsSessionOnItsHost(t *testing.T) {
	hs, c := hosts(t, time.Minute, sharedSecret, sharedSecret)
	a, b := hs[0], hs[1]
	id := a.open(t)
	if got := b.ping(id); got != http.StatusOK {
		t.Fatalf("ping on the second host: %d", got)
	}
	if w := a.do("DELETE", id, ""); w.Code != http.StatusOK {
		t.Fatalf("DELETE: %d %s", w.Code, w.Body)
	}
	if got := a.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on the host that got DELETE: %d, want 404", got)
	}
	if a.ss.count() != 0 || a.registered.Load() != 0 {
		t.Errorf("after DELETE the host keeps %d sessions, %d in mcp-go", a.ss.count(), a.registered.Load())
	}
	c.Advance(30 * time.Second)
	if got := b.ping(id); got != http.StatusOK {
		t.Errorf("ping on the other host: %d; it serves the session until it idles out there", got)
	}
	c.Advance(time.Minute)
	if got := b.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on the other host once idle: %d, want 404", got)
	}
	if got := a.ping(id); got != http.StatusNotFound {
		t.Errorf("ping on the host that got DELETE, later: %d, want 404", got)
	}
}

// TestEventStreamOnAnotherHost: a GET event stream opens on a host that
// never saw the session's initialize, keeps the session from idling out
// there while it is open, and leaves nothing behind in mcp-go.
func TestEventStreamOnAnotherHost(t *testing.T) {
	hs, c := hosts(t, time.Minute, sharedSecret, sharedSecret)
	a, b := hs[0], hs[1]
	id := a.open(t)
	srv := httptest.NewServer(http.HandlerFunc(b.ss.serve))
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("GET on the other host: %d %s, want 200 and an event stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if got := b.registered.Load(); got != 1 {
		t.Errorf("registered in mcp-go while the stream is open: %d, want 1", got)
	}
	c.Advance(10 * time.Minute)
	if got := b.ping(id); got != http.StatusOK {
		t.Errorf("ping while the stream is open, 10 min on: %d, want 200", got)
	}
	cancel()
	resp.Body.Close()
	srv.Close() // waits for the stream's handler to end
	if got := b.registered.Load(); got != 0 {
		t.Errorf("registered in mcp-go after the stream: %d, want 0", got)
	}
	c.Advance(time.Minute)
	if got := b.ping(id); got != http.StatusNotFound {
		t.Errorf("ping a minute after the stream ended: %d, want 404", got)
	}
}
