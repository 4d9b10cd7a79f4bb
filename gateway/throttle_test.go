package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
)

// throttleRig is a gate on a fixed clock and a way to call it from an
// address with a token.
type throttleRig struct {
	clk *testkit.Clock
	h   http.Handler
}

func newThrottleRig(t *testing.T) *throttleRig {
	clk := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g := newGate(Config{Keys: testStore(t, true), Loopback: true, Clock: clk})
	return &throttleRig{clk: clk, h: g.walls(echoCaller)}
}

func (rg *throttleRig) call(ip, token string) int {
	r := httptest.NewRequest("GET", "http://127.0.0.1:8787/v1/quota", nil)
	r.RemoteAddr = ip + ":40000"
	r.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	rg.h.ServeHTTP(w, r)
	return w.Code
}

// TestThrottleRotatingAddresses: a guesser rotating its source address
// across 127.0.0.0/8 (issue 13: 589 guesses in 5.5 s, none refused) gets
// at most blockLimit of its guesses checked in a minute; across many
// /24s, at most globalLimit. Tokens already in use from their address go
// on working meanwhile.
func TestThrottleRotatingAddresses(t *testing.T) {
	rg := newThrottleRig(t)
	if got := rg.call("127.0.0.1", tokenA); got != 200 {
		t.Fatalf("a working client: %d", got)
	}
	checked := 0
	for i := range 589 {
		if got := rg.call(fmt.Sprintf("127.%d.%d.%d", i/62500%250, i/250%250, i%250+1), fmt.Sprint("guess-", i)); got == 401 {
			checked++
		} else if got != 429 {
			t.Fatalf("guess %d: %d, want 401 or 429", i, got)
		}
	}
	if checked > blockLimit {
		t.Errorf("%d of 589 guesses from rotating loopback addresses were checked, want at most %d", checked, blockLimit)
	}
	t.Logf("589 guesses from rotating loopback addresses: %d checked, %d refused unchecked", checked, 589-checked)
	if got := rg.call("127.0.0.1", tokenA); got != 200 {
		t.Errorf("the working client during the guessing: %d, want 200", got)
	}
	if got := rg.call("127.9.9.9", tokenB); got != 429 {
		t.Errorf("a token new to its address while its block is over the limit: %d, want 429", got)
	}
	rg.clk.Advance(badTokenWindow + time.Second)
	if got := rg.call("127.9.9.9", tokenB); got != 200 {
		t.Errorf("that token a minute after the guessing stopped: %d, want 200", got)
	}

	// Across /24s, the listener's own count holds.
	rg = newThrottleRig(t)
	checked = 0
	for i := range 1000 {
		if got := rg.call(fmt.Sprintf("10.%d.%d.1", i/256, i%256), fmt.Sprint("guess-", i)); got == 401 {
			checked++
		}
	}
	if checked > globalLimit {
		t.Errorf("%d of 1000 guesses from 1000 networks were checked, want at most %d", checked, globalLimit)
	}
	t.Logf("1000 guesses from 1000 /24 networks: %d checked", checked)
}

// TestThrottleCarelessClient: 20 different bad tokens from one address
// (issue 13: they locked every local client out for a minute) do not
// stop the clients beside it whose tokens are in use; a guesser on that
// address that goes on is cut off entirely, but not on a connection
// where a token already authenticated.
func TestThrottleCarelessClient(t *testing.T) {
	rg := newThrottleRig(t)
	rg.call("127.0.0.1", tokenA)
	rg.call("127.0.0.1", tokenB)
	for i := range badTokenLimit {
		if got := rg.call("127.0.0.1", fmt.Sprint("typo-", i)); got != 401 {
			t.Fatalf("bad token %d: %d", i, got)
		}
	}
	for _, tok := range []string{tokenA, tokenB} {
		if got := rg.call("127.0.0.1", tok); got != 200 {
			t.Errorf("a client in use beside the careless one: %d, want 200", got)
		}
	}
	if got := rg.call("127.0.0.1", "typo-more"); got != 429 {
		t.Errorf("the careless client's next bad token: %d, want 429 (unchecked)", got)
	}
	for i := range hardLimit {
		rg.call("127.0.0.1", fmt.Sprint("more-", i))
	}
	if got := rg.call("127.0.0.1", tokenA); got != 429 {
		t.Errorf("after %d different tokens from the address: %d, want 429 even for a known token", hardLimit, got)
	}
}

// TestThrottleTrustedConnection: a token that authenticated on a
// connection is checked on it whatever its address did.
func TestThrottleTrustedConnection(t *testing.T) {
	g := newGate(Config{Keys: testStore(t, true), Loopback: true})
	srv := httptest.NewUnstartedServer(g.walls(echoCaller))
	srv.Config.ConnContext = withConnTrust
	srv.Start()
	t.Cleanup(srv.Close)
	good := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	get := func(c *http.Client, token string) int {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/quota", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) // so the connection is kept
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(good, tokenA); got != 200 {
		t.Fatalf("first call: %d", got)
	}
	bad := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 2 * hardLimit {
		get(bad, fmt.Sprint("guess-", i))
	}
	if got := get(bad, tokenA); got != 429 {
		t.Errorf("a known token on a new connection from the guessing address: %d, want 429", got)
	}
	if got := get(good, tokenA); got != 200 {
		t.Errorf("the token on the connection it authenticated on: %d, want 200", got)
	}
}

// TestEventStreamsDoNotStarveCalls: 16 idle GET /mcp streams (issue 13:
// they took all of a caller's 16 slots) leave the caller's calls free.
func TestEventStreamsDoNotStarveCalls(t *testing.T) {
	g := newGate(Config{Keys: testStore(t, true), Loopback: true})
	release := make(chan struct{})
	var open sync.WaitGroup
	h := g.walls(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/mcp" {
			open.Done()
			<-release
		}
	}))
	call := func(method, path string) int {
		r := httptest.NewRequest(method, "http://127.0.0.1:8787"+path, strings.NewReader("{}"))
		r.RemoteAddr = "127.0.0.1:5000"
		r.Header.Set("Authorization", "Bearer "+tokenA)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	open.Add(16)
	done := make(chan int, 16)
	for range 16 {
		go func() { done <- call("GET", "/mcp") }()
	}
	open.Wait()
	if got := call("POST", "/mcp"); got != 200 {
		t.Errorf("a call beside 16 idle streams: %d, want 200", got)
	}
	if got := call("GET", "/mcp"); got != 429 {
		t.Errorf("a 17th stream: %d, want 429", got)
	}
	close(release)
	for range 16 {
		<-done
	}
}

// cookieDashboard is a Dashboard whose one sign-in is the cookie
// mcpq_session=valid-cookie, of caller a.
type cookieDashboard struct{ http.Handler }

func (cookieDashboard) Open(*http.Request) bool { return false }

func (cookieDashboard) Session(r *http.Request) (*keystore.Caller, bool) {
	if c, err := r.Cookie("mcpq_session"); err == nil && c.Value == "valid-cookie" {
		return keystore.Local("a"), true
	}
	return nil, false
}

// TestThrottleCountsCookieGuesses: guessed session cookies count with
// the bad tokens, each guess a different one: a guesser rotating its
// address across 127.0.0.0/8 gets at most blockLimit guesses checked in
// a minute, while the browser already signed in from its address goes on.
func TestThrottleCountsCookieGuesses(t *testing.T) {
	g := newGate(Config{Keys: testStore(t, true), Loopback: true, Clock: testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		Dashboard: cookieDashboard{echoCaller}})
	h := g.walls(echoCaller)
	call := func(ip, cookie string) int {
		r := httptest.NewRequest("GET", "http://127.0.0.1:8787/ui/api/overview", nil)
		r.RemoteAddr = ip + ":40000"
		r.Header.Set("Cookie", "mcpq_session="+cookie)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if got := call("127.0.0.1", "valid-cookie"); got != 200 {
		t.Fatalf("the signed-in browser: %d", got)
	}
	checked := 0
	for i := range 589 {
		switch got := call(fmt.Sprintf("127.%d.%d.%d", i/62500%250, i/250%250, i%250+1), fmt.Sprint("guess-", i)); got {
		case 401:
			checked++
		case 429:
		default:
			t.Fatalf("guess %d: %d, want 401 or 429", i, got)
		}
	}
	t.Logf("589 cookie guesses from rotating loopback addresses: %d checked", checked)
	if checked > blockLimit {
		t.Errorf("%d of 589 cookie guesses were checked, want at most %d", checked, blockLimit)
	}
	if got := call("127.0.0.1", "valid-cookie"); got != 200 {
		t.Errorf("the signed-in browser during the guessing: %d, want 200", got)
	}
}
