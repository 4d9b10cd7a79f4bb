package gateway

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
)

// TestTrustedProxyClientAddress: behind a trusted proxy, the bad-token
// throttle counts each client by the address the proxy names, so one
// client's guesses do not lock out another behind the same proxy; a peer
// that is not a trusted proxy is counted by its own address, whatever
// X-Forwarded-For it sends.
func TestTrustedProxyClientAddress(t *testing.T) {
	clk := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	proxies, err := ParseProxies("10.0.0.1, 192.168.7.0/24")
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(Config{Keys: testStore(t, true), Loopback: false, Clock: clk, TrustedProxies: proxies})
	h := g.walls(echoCaller)
	call := func(peer, forwardedFor, token string) int {
		r := httptest.NewRequest("GET", "http://mcp.example:8787/v1/quota", nil)
		r.RemoteAddr = peer + ":40000"
		if forwardedFor != "" {
			r.Header.Set("X-Forwarded-For", forwardedFor)
		}
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for i := range badTokenLimit + 5 {
		call("10.0.0.1", "203.0.113.7", fmt.Sprint("guess-", i))
	}
	if got := call("10.0.0.1", "203.0.113.7", tokenA); got != http.StatusTooManyRequests {
		t.Errorf("a token new to the guessing client's address: %d, want 429", got)
	}
	// Another client of the same proxy; and one through two proxy hops.
	if got := call("10.0.0.1", "198.51.100.9", tokenB); got != http.StatusOK {
		t.Errorf("another client behind the proxy: %d, want 200", got)
	}
	if got := call("192.168.7.20", "203.0.113.7, 10.0.0.1", tokenB); got != http.StatusTooManyRequests {
		t.Errorf("the guessing client through two hops: %d, want 429", got)
	}
	// An untrusted peer naming an address it is not.
	for i := range badTokenLimit + 5 {
		call("198.51.100.50", fmt.Sprintf("203.0.113.%d", i), fmt.Sprint("spoof-", i))
	}
	if got := call("198.51.100.50", "198.51.100.77", tokenA); got != http.StatusTooManyRequests {
		t.Errorf("an untrusted peer's new token after its guesses: %d, want 429 (counted by its own address)", got)
	}
}

func TestParseProxies(t *testing.T) {
	got, err := ParseProxies(" 10.0.0.5 , 192.168.1.77/16,::1,")
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("::1/128")}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ParseProxies: %v %v, want %v", got, err, want)
	}
	if _, err := ParseProxies("10.0.0.5, proxy.example"); err == nil || !strings.Contains(err.Error(), `"proxy.example"`) {
		t.Errorf("ParseProxies of a name: %v, want an error naming it", err)
	}
}
