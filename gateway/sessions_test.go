package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// mcpSide is the Streamable HTTP side of a bare MCP server, as New builds
// it, with a count of the sessions mcp-go itself has registered.
type mcpSide struct {
	ss         *sessions
	clock      *testkit.Clock
	registered atomic.Int64
}

func newMCPSide(t *testing.T, idle time.Duration) *mcpSide {
	t.Helper()
	return newMCPHost(t, idle, keystore.Secret{}, testkit.NewClock(t0))
}

// newMCPHost is newMCPSide for one of several hosts that share secret
// and clock.
func newMCPHost(t *testing.T, idle time.Duration, secret keystore.Secret, c *testkit.Clock) *mcpSide {
	t.Helper()
	m := &mcpSide{clock: c}
	hooks := &server.Hooks{}
	hooks.AddOnRegisterSession(func(ctx context.Context, s server.ClientSession) { m.registered.Add(1) })
	hooks.AddOnUnregisterSession(func(ctx context.Context, s server.ClientSession) { m.registered.Add(-1) })
	srv := server.NewMCPServer("sessions-test", "1", server.WithHooks(hooks))
	m.ss = newMCP(Config{MCP: srv, SessionIdle: idle, Clock: m.clock, SessionSecret: secret})
	return m
}

// do sends one request to the MCP side and returns the recorded answer.
func (m *mcpSide) do(method, session, body string, header ...string) *httptest.ResponseRecorder {
	return m.doAs("", method, session, body, header...)
}

// doAs is do as the caller named caller, as the walls let it through
// ("": as none).
func (m *mcpSide) doAs(caller, method, session, body string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "http://127.0.0.1:8787/mcp", strings.NewReader(body))
	if caller != "" {
		r = r.WithContext(keystore.WithCaller(r.Context(), keystore.Local(caller)))
	}
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	r.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		r.Header.Set("Mcp-Session-Id", session)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	m.ss.serve(w, r)
	return w
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// open starts a session with the initialize handshake and returns its ID.
func (m *mcpSide) open(t testing.TB) string {
	t.Helper()
	w := m.do("POST", "", initialize)
	id := w.Header().Get("Mcp-Session-Id")
	if w.Code != http.StatusOK || id == "" {
		t.Fatalf("initialize: %d, session %q: %s", w.Code, id, w.Body)
	}
	return id
}

func (m *mcpSide) ping(id string) int {
	return m.do("POST", id, `{"jsonrpc":"2.0","id":2,"method":"ping"}`).Code
}

// TestSessionsExpireWhenIdle opens sessions, lets some idle past the
// timeout, and sees them end — in mcp-quota's count and in mcp-go's — and
// answer 404, while a session in use lives on.
func TestSessionsExpireWhenIdle(t *testing.T) {
	m := newMCPSide(t, time.Minute)
	var idle []string
	for range 5 {
		idle = append(idle, m.open(t))
	}
	used := m.open(t)
	if got := m.ping(idle[0]); got != http.StatusOK {
		t.Fatalf("ping in a fresh session: %d", got)
	}
	if n, r := m.ss.count(), m.registered.Load(); n != 6 || r != 6 {
		t.Fatalf("sessions %d, registered in mcp-go %d; want 6 and 6", n, r)
	}
	for range 4 { // 2 min in all, the used session pinged every 30 s
		m.clock.Advance(30 * time.Second)
		if got := m.ping(used); got != http.StatusOK {
			t.Fatalf("ping in the session in use: %d", got)
		}
	}
	if n, r := m.ss.count(), m.registered.Load(); n != 1 || r != 1 {
		t.Errorf("after 2 min: sessions %d, registered in mcp-go %d; want the one in use", n, r)
	}
	for _, id := range idle {
		if got := m.ping(id); got != http.StatusNotFound {
			t.Errorf("ping in an ended session: %d, want 404", got)
		}
	}
	// A session past its time ends at its next request even before a
	// sweep comes by.
	m.clock.Advance(time.Minute)
	if w := m.do("POST", used, `{"jsonrpc":"2.0","id":3,"method":"ping"}`); w.Code != http.StatusNotFound ||
		!strings.Contains(w.Body.String(), "initialize") {
		t.Errorf("ping after a minute idle: %d %q, want 404 saying to initialize", w.Code, w.Body)
	}
	if n, r := m.ss.count(), m.registered.Load(); n != 0 || r != 0 {
		t.Errorf("sessions %d, registered in mcp-go %d; want none", n, r)
	}
	// initialize starts a new session even from a client that still
	// sends the header of its ended one.
	if w := m.do("POST", idle[0], initialize); w.Code != http.StatusOK || w.Header().Get("Mcp-Session-Id") == "" ||
		w.Header().Get("Mcp-Session-Id") == idle[0] {
		t.Errorf("initialize with an ended session's header: %d, session %q", w.Code, w.Header().Get("Mcp-Session-Id"))
	}
	if n := m.ss.count(); n != 1 {
		t.Errorf("sessions after a new initialize: %d, want 1", n)
	}
	m.clock.Advance(2 * time.Minute)
	m.ss.sweep()
	// DELETE still ends a session at once.
	id := m.open(t)
	if w := m.do("DELETE", id, ""); w.Code != http.StatusOK {
		t.Errorf("DELETE: %d %s", w.Code, w.Body)
	}
	if n, r := m.ss.count(), m.registered.Load(); n != 0 || r != 0 {
		t.Errorf("after DELETE: sessions %d, registered in mcp-go %d; want none", n, r)
	}
}

// TestBusySessionDoesNotExpire: a session with a request in flight (a GET
// stream, a long call) is not idle, however long it lasts.
func TestBusySessionDoesNotExpire(t *testing.T) {
	m := newMCPSide(t, time.Minute)
	id := m.open(t)
	if !m.ss.enter(id, "") {
		t.Fatal("enter a live session: false")
	}
	m.clock.Advance(10 * time.Minute)
	m.ss.sweep()
	if m.ss.count() != 1 {
		t.Fatal("a busy session ended")
	}
	m.ss.leave(id)
	m.clock.Advance(59 * time.Second)
	if got := m.ping(id); got != http.StatusOK {
		t.Errorf("ping 59 s after the long request ended: %d", got)
	}
}

// TestGetWithoutSession: a GET outside any session is answered 405 with
// Allow, not with a stream that never ends; a GET naming a session that
// is not live is 404; a 2026-07-28 GET is mcp-go's 405.
func TestGetWithoutSession(t *testing.T) {
	m := newMCPSide(t, time.Minute)
	w := m.do("GET", "", "")
	if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, POST, DELETE" {
		t.Errorf("GET without a session: %d, Allow %q: %s", w.Code, w.Header().Get("Allow"), w.Body)
	}
	if w := m.do("GET", "no-such-session", ""); w.Code != http.StatusNotFound {
		t.Errorf("GET in an unknown session: %d, want 404: %s", w.Code, w.Body)
	}
	if w := m.do("GET", "", "", "Mcp-Protocol-Version", "2026-07-28"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET at 2026-07-28: %d, want 405: %s", w.Code, w.Body)
	}
	if m.ss.count() != 0 || m.registered.Load() != 0 {
		t.Errorf("GETs left sessions: %d, registered %d", m.ss.count(), m.registered.Load())
	}
}

// TestSessionMemoryComesBack opens many sessions, lets them idle out, and
// measures the heap after a collection: what they took comes back.
func TestSessionMemoryComesBack(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 500
	}
	m := newMCPSide(t, time.Minute)
	m.ss.maxTotal, m.ss.maxPerCaller = n+1, n+1 // what one session takes, not the bounds
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	m.open(t) // warm up what one session allocates once
	m.clock.Advance(2 * time.Minute)
	m.do("GET", "", "")
	before := heap()
	for range n {
		m.open(t)
	}
	full := heap()
	if m.ss.count() != n || m.registered.Load() != int64(n) {
		t.Fatalf("sessions %d, registered %d; want %d", m.ss.count(), m.registered.Load(), n)
	}
	m.clock.Advance(2 * time.Minute)
	m.do("GET", "", "") // any request sweeps
	after := heap()
	if m.ss.count() != 0 || m.registered.Load() != 0 {
		t.Fatalf("after the idle timeout: sessions %d, registered %d; want none", m.ss.count(), m.registered.Load())
	}
	grew := int64(full) - int64(before)
	kept := int64(after) - int64(before)
	t.Logf("%d sessions: heap %d -> %d -> %d bytes (%.1f KB a session; %d bytes kept after they ended)",
		n, before, full, after, float64(grew)/float64(n)/1024, kept)
	if grew < int64(n)*1024 {
		t.Fatalf("the sessions took %d bytes, under 1 KB each: the measure is off", grew)
	}
	if kept > grew/10 {
		t.Errorf("%d of the %d bytes the sessions took are still held after they ended", kept, grew)
	}
}

// TestSessionsBounded: live sessions are bounded per caller and in all.
// An initialize past a bound is refused with a JSON-RPC error saying
// which bound and what to do, and opens nothing: a thousand more
// initialize requests leave the count of live sessions, here and in
// mcp-go, where it was. A session that ends makes room again, and a host
// does not take up another's sessions past its bounds.
func TestSessionsBounded(t *testing.T) {
	hs, c := hosts(t, time.Minute, sharedSecret, sharedSecret)
	m, elsewhere := hs[0], hs[1]
	m.ss.maxPerCaller, m.ss.maxTotal = 3, 5
	elsewhere.ss.maxPerCaller = 1
	open := func(caller string) (string, *httptest.ResponseRecorder) {
		w := m.doAs(caller, "POST", "", initialize)
		return w.Header().Get("Mcp-Session-Id"), w
	}
	refused := func(w *httptest.ResponseRecorder, want ...string) {
		t.Helper()
		var msg struct {
			ID    int `json:"id"`
			Error struct {
				Message string
				Data    struct{ Code string }
			}
		}
		if err := json.Unmarshal(w.Body.Bytes(), &msg); err != nil || w.Header().Get("Mcp-Session-Id") != "" ||
			msg.ID != 1 || msg.Error.Data.Code != "tooManySessions" {
			t.Fatalf("initialize past the bound: %d, session %q: %s; want a JSON-RPC error to it, code tooManySessions",
				w.Code, w.Header().Get("Mcp-Session-Id"), w.Body)
		}
		for _, s := range want {
			if !strings.Contains(msg.Error.Message, s) {
				t.Errorf("the refusal %q does not say %q", msg.Error.Message, s)
			}
		}
	}
	var own []string
	for range 3 {
		id, w := open("a")
		if id == "" {
			t.Fatalf("initialize within the bound: %d %s", w.Code, w.Body)
		}
		own = append(own, id)
	}
	_, w := open("a")
	refused(w, "Caller 'a' has 3 MCP sessions open", "DELETE", "60 s", "--max-sessions-per-caller")
	for range 2 {
		if id, w := open("b"); id == "" {
			t.Fatalf("b's initialize within the bounds: %d %s", w.Code, w.Body)
		}
	}
	_, w = open("c")
	refused(w, "has 5 MCP sessions open, the most it keeps", "--max-sessions")
	for i := range 1000 {
		if id, _ := open([]string{"a", "b", "c"}[i%3]); id != "" {
			t.Fatalf("initialize %d past the bounds opened session %q", i, id)
		}
	}
	if n, r := m.ss.count(), m.registered.Load(); n != 5 || r != 5 {
		t.Fatalf("after 1000 initialize requests past the bounds: %d sessions live, %d in mcp-go; want 5 and 5", n, r)
	}
	// A session of a's taken up by a host whose bound is 1 for a caller:
	// the first is, the second is not.
	if w := elsewhere.doAs("a", "POST", own[0], `{"jsonrpc":"2.0","id":2,"method":"ping"}`); w.Code != http.StatusOK {
		t.Errorf("ping on another host: %d %s", w.Code, w.Body)
	}
	if w := elsewhere.doAs("a", "POST", own[1], `{"jsonrpc":"2.0","id":2,"method":"ping"}`); w.Code != http.StatusNotFound {
		t.Errorf("ping of a second session on a host bound to one: %d %s, want 404", w.Code, w.Body)
	}
	if n := elsewhere.ss.count(); n != 1 {
		t.Errorf("the other host keeps %d sessions, want 1", n)
	}
	// DELETE makes room for its caller.
	if w := m.doAs("a", "DELETE", own[0], ""); w.Code != http.StatusOK {
		t.Fatalf("DELETE: %d %s", w.Code, w.Body)
	}
	if id, w := open("a"); id == "" {
		t.Errorf("initialize after a DELETE: %d %s", w.Code, w.Body)
	}
	// So does idling out, for every caller.
	c.Advance(2 * time.Minute)
	for _, caller := range []string{"c", "a", "a", "a"} {
		if id, w := open(caller); id == "" {
			t.Errorf("%s's initialize once the sessions idled out: %d %s", caller, w.Code, w.Body)
		}
	}
	if n, r := m.ss.count(), m.registered.Load(); n != 4 || r != 4 {
		t.Errorf("sessions live: %d, in mcp-go %d; want 4 and 4", n, r)
	}
	m.ss.mu.Lock()
	defer m.ss.mu.Unlock()
	if m.ss.opening != 0 || m.ss.perCaller["a"] != 3 || m.ss.perCaller["c"] != 1 || len(m.ss.perCaller) != 2 {
		t.Errorf("places held: %d opening, per caller %v; want none opening, a 3, c 1", m.ss.opening, m.ss.perCaller)
	}
}
