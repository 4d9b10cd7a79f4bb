package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

const (
	tokenA = "gateway-token-AAAAAAAAAAAA"
	tokenB = "gateway-token-BBBBBBBBBBBB"
)

func testStore(t *testing.T, withCallers bool) *keystore.Store {
	t.Helper()
	cfg := testkit.Config{Keys: []testkit.Key{{Name: "k", BaseURL: "https://api.example.com", Auth: "none"}}}
	if withCallers {
		cfg.Callers = []testkit.Caller{{Name: "a", TokenEnv: "A", Keys: []string{"k"}}, {Name: "b", TokenEnv: "B", Keys: []string{"*"}}}
	}
	env := map[string]string{"A": tokenA, "B": tokenB}
	s, err := keystore.Parse([]byte(cfg.TOML()), keystore.Env{Getenv: func(k string) string { return env[k] }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// echoCaller is the handler behind the walls in these tests: it answers
// with the caller the walls found.
var echoCaller = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	c, ok := keystore.CallerFrom(r.Context())
	if !ok {
		http.Error(w, "no caller", 500)
		return
	}
	fmt.Fprint(w, c.Name)
})

type wallCase struct {
	name   string
	host   string // "" means 127.0.0.1:8787
	header []string
	status int
	code   string // of the problem; "" for a pass
	caller string // who passed
}

func runWalls(t *testing.T, h http.Handler, tests []wallCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "http://127.0.0.1:8787/mcp", nil)
			r.RemoteAddr = "127.0.0.1:50000"
			if tt.host != "" {
				r.Host = tt.host
			}
			for i := 0; i+1 < len(tt.header); i += 2 {
				r.Header.Add(tt.header[i], tt.header[i+1])
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.code == "" {
				if got := w.Body.String(); got != tt.caller {
					t.Errorf("passed as %q, want %q", got, tt.caller)
				}
				return
			}
			var p struct{ Code string }
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Code != tt.code ||
				w.Header().Get("Content-Type") != "application/problem+json" {
				t.Errorf("answer %s %q, want a problem with code %q", w.Header().Get("Content-Type"), w.Body, tt.code)
			}
		})
	}
}

func TestWallsOnLoopback(t *testing.T) {
	g := newGate(Config{Keys: testStore(t, true), Loopback: true, AllowOrigins: []string{"http://localhost:6274"}})
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	with := func(h []string, more ...string) []string { return append(append([]string(nil), h...), more...) }
	a := bearer(tokenA)
	runWalls(t, g.walls(echoCaller), []wallCase{
		{"token A", "", a, 200, "", "a"},
		{"token B", "", bearer(tokenB), 200, "", "b"},
		{"scheme in lower case", "", []string{"Authorization", "bearer " + tokenA}, 200, "", "a"},
		{"localhost", "localhost:8787", a, 200, "", "a"},
		{"IPv6 loopback", "[::1]:8787", a, 200, "", "a"},
		{"another loopback address", "127.0.0.2:8787", a, 200, "", "a"},
		{"same origin", "", with(a, "Origin", "http://127.0.0.1:8787"), 200, "", "a"},
		{"allowed origin", "", with(a, "Origin", "http://localhost:6274", "Sec-Fetch-Site", "cross-site"), 200, "", "a"},
		{"same-origin fetch", "", with(a, "Sec-Fetch-Site", "same-origin"), 200, "", "a"},

		{"no token", "", nil, 401, "unauthorized", ""},
		{"empty bearer", "", bearer(""), 401, "unauthorized", ""},
		{"wrong token", "", bearer("gateway-token-CCCCCCCCCCCC"), 401, "unauthorized", ""},
		{"prefix of a token", "", bearer(tokenA[:len(tokenA)-1]), 401, "unauthorized", ""},
		{"token as Basic", "", []string{"Authorization", "Basic " + tokenA}, 401, "unauthorized", ""},
		{"token without scheme", "", []string{"Authorization", tokenA}, 401, "unauthorized", ""},

		{"foreign Host", "evil.example:8787", a, 403, "forbidden", ""},
		{"Host naming loopback in a domain", "127.0.0.1.nip.io:8787", a, 403, "forbidden", ""},
		{"no Host", " ", a, 403, "forbidden", ""},
		{"foreign Origin", "", with(a, "Origin", "http://evil.example"), 403, "forbidden", ""},
		{"Origin on another loopback port", "", with(a, "Origin", "http://127.0.0.1:9999"), 403, "forbidden", ""},
		{"Origin of another scheme", "", with(a, "Origin", "file://127.0.0.1:8787"), 403, "forbidden", ""},
		{"null Origin", "", with(a, "Origin", "null"), 403, "forbidden", ""},
		{"cross-site fetch", "", with(a, "Sec-Fetch-Site", "cross-site"), 403, "forbidden", ""},
		{"same-site fetch from another port", "", with(a, "Sec-Fetch-Site", "same-site", "Origin", "http://localhost:3000"), 403, "forbidden", ""},
		{"header section too large", "", with(a, "X-Big", strings.Repeat("x", 33<<10)), 431, "payloadTooLarge", ""},
	})
}

func TestWallsWithoutCallers(t *testing.T) {
	// On loopback with no [[callers]], every request is the local user.
	g := newGate(Config{Keys: testStore(t, false), Loopback: true})
	runWalls(t, g.walls(echoCaller), []wallCase{
		{"no token", "", nil, 200, "", "local"},
		{"foreign Host still refused", "evil.example", nil, 403, "forbidden", ""},
	})
	// Elsewhere, nobody gets in (and `mcp-quota serve` refuses to start).
	g = newGate(Config{Keys: testStore(t, false), Loopback: false})
	runWalls(t, g.walls(echoCaller), []wallCase{
		{"no token", "mcp-quota.internal:8787", nil, 401, "unauthorized", ""},
	})
}

func TestBadTokenThrottle(t *testing.T) {
	clk := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g := newGate(Config{Keys: testStore(t, true), Loopback: true, Clock: clk})
	h := g.walls(echoCaller)
	call := func(ip, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "http://127.0.0.1:8787/v1/quota", nil)
		r.RemoteAddr = ip + ":40000"
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i := range badTokenLimit {
		if w := call("127.0.0.1", fmt.Sprint("guess-", i)); w.Code != 401 {
			t.Fatalf("bad token %d: %d", i+1, w.Code)
		}
		clk.Advance(time.Second)
	}
	for _, tok := range []string{"guess-more", tokenA} {
		w := call("127.0.0.1", tok)
		if w.Code != 429 || w.Header().Get("Retry-After") != "40" {
			t.Errorf("%s after %d bad tokens: %d, Retry-After %q; want 429, 40", tok, badTokenLimit, w.Code, w.Header().Get("Retry-After"))
		}
	}
	if w := call("10.0.0.9", tokenA); w.Code != 200 {
		t.Errorf("another address: %d, want 200", w.Code)
	}
	clk.Advance(41 * time.Second) // the first bad token leaves the window
	if w := call("127.0.0.1", tokenA); w.Code != 200 {
		t.Errorf("once the oldest bad token is a minute old: %d, want 200", w.Code)
	}
	// A client stuck on one stale token (or none) is refused alone: the
	// other clients of its address, every local one on loopback, go on.
	for _, stale := range []string{"stale", ""} {
		for i := range badTokenLimit {
			if w := call("127.0.0.2", stale); w.Code != 401 {
				t.Fatalf("stale token %q, try %d: %d, want 401", stale, i+1, w.Code)
			}
		}
		if w := call("127.0.0.2", stale); w.Code != 429 || w.Header().Get("Retry-After") != "60" {
			t.Errorf("stale token %q after %d tries: %d, Retry-After %q; want 429, 60", stale, badTokenLimit, w.Code, w.Header().Get("Retry-After"))
		}
		if w := call("127.0.0.2", tokenA); w.Code != 200 {
			t.Errorf("a good token beside stale token %q: %d, want 200", stale, w.Code)
		}
	}
	// Many addresses with one bad token each are forgotten once old.
	for i := range maxFailureAddrs + 10 {
		call(fmt.Sprintf("10.%d.%d.1", i/256, i%256), "guess")
	}
	clk.Advance(2 * time.Minute)
	call("192.0.2.1", "guess")
	g.throttle.mu.Lock()
	n := len(g.throttle.failures)
	g.throttle.mu.Unlock()
	if n > 3 { // the address, its block and the whole listener
		t.Errorf("%d addresses remembered, want the stale ones forgotten", n)
	}
}

func TestConcurrencyPerCaller(t *testing.T) {
	g := newGate(Config{Keys: testStore(t, true), Loopback: true, MaxConcurrent: 2})
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(2)
	h := g.walls(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered.Done()
			<-release
		}
	}))
	call := func(path, token string) int {
		r := httptest.NewRequest("GET", "http://127.0.0.1:8787"+path, nil)
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	done := make(chan int, 2)
	for range 2 {
		go func() { done <- call("/hold", tokenA) }()
	}
	entered.Wait()
	if got := call("/now", tokenA); got != 429 {
		t.Errorf("a third call of caller a: %d, want 429", got)
	}
	if got := call("/now", tokenB); got != 200 {
		t.Errorf("a call of caller b: %d, want 200", got)
	}
	close(release)
	<-done
	<-done
	if got := call("/now", tokenA); got != 200 {
		t.Errorf("caller a once its calls ended: %d, want 200", got)
	}
}

func TestLoopbackHost(t *testing.T) {
	tests := map[string]bool{
		"127.0.0.1": true, "127.0.0.1:8787": true, "localhost": true, "LOCALHOST:1": true, "[::1]:8787": true, "::1": true,
		"localhost.evil.example": false, "evil.example": false, "": false, "[::ffff:8.8.8.8]:1": false, "0.0.0.0:8787": false,
	}
	for host, want := range tests {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestNewServerLimits(t *testing.T) {
	s := NewServer("127.0.0.1:0", http.NotFoundHandler(), nil)
	if s.ReadHeaderTimeout == 0 || s.ReadTimeout == 0 || s.WriteTimeout == 0 || s.IdleTimeout == 0 || s.MaxHeaderBytes == 0 {
		t.Errorf("a limit is not set: %+v", s)
	}
}

func TestRemoteIP(t *testing.T) {
	tests := map[string]string{
		"127.0.0.1:5000":              "127.0.0.1",
		"[::ffff:10.0.0.1]:5000":      "10.0.0.1",
		"[2001:db8:1:2:3:4:5:6]:5000": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:5000": "2001:db8:1:2::/64", // the same /64
		"[fe80::1%eth0]:5000":         "fe80::/64",
		"[::1]:5000":                  "::1",
		"not an address":              "not an address",
	}
	for addr, want := range tests {
		if got := remoteIP(&http.Request{RemoteAddr: addr}); got != want {
			t.Errorf("remoteIP(%q) = %q, want %q", addr, got, want)
		}
	}
	// Every loopback address is one block, as walls.md says: guesses
	// rotated over 127.0.0.0/8 and ::1 share its 60.
	for _, addr := range []string{"127.0.0.1:5000", "127.9.8.7:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"} {
		if got := addrBlock(remoteIP(&http.Request{RemoteAddr: addr})); got != "loopback" {
			t.Errorf("the block of %s = %q, want loopback", addr, got)
		}
	}
}
