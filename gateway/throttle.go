package gateway

import (
	"context"
	"crypto/sha256"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// The bad-token throttle. Bad tokens are counted over a sliding minute in
// three scopes: the address (an IPv4 address, an IPv6 /64), its block
// (an IPv4 /24, an IPv6 /48; every loopback address, 127.0.0.0/8 and ::1,
// is one block) and the listener as a whole. What a scope counts is
// different bad tokens, so a client stuck on one stale token counts once
// there; that token itself is refused after badTokenLimit tries from its
// address (429), and only that token.
//
// When a scope has seen its limit of different bad tokens, requests from
// it are refused (429) without their token being checked — a guesser
// learns nothing from them, however many addresses it rotates through —
// except a token that authenticated from the very same address within
// knownFor: that one is checked, and passes when valid, so a careless
// client's bad tokens do not lock out the clients beside it. Each refused
// token still counts against its address, and an address that shows
// hardLimit different tokens in a minute gets no exception (its known
// tokens included). On a connection where a token already authenticated,
// that token is always checked: a working client is never refused for
// anyone's bad tokens.
//
// So a guesser gets at most badTokenLimit checked guesses a minute per
// address, blockLimit per block and globalLimit in all (plus, per
// address, lookups of the tokens in use from that very address until it
// reaches hardLimit); and a valid token is refused only when it is new
// to its address while its scope is over a limit, for at most a minute
// after the bad tokens stop.
const (
	badTokenLimit  = 20  // different bad tokens per address, and tries of one bad token
	hardLimit      = 40  // different tokens per address, checked or refused, beyond which no exception holds
	blockLimit     = 60  // different bad tokens per block
	globalLimit    = 200 // different bad tokens in all
	badTokenWindow = time.Minute
	knownFor       = time.Hour
)

// maxFailureAddrs bounds the scopes whose bad tokens are remembered (and
// the addresses whose good tokens are); past it, scopes with nothing in
// the window are forgotten, then any.
const maxFailureAddrs = 4096

// A failure is one bad token seen in a scope: when, a print of the token
// (a hash prefix, kept in memory only) to tell tokens apart, and whether
// it was refused unchecked (such a failure counts as a different token,
// not as a try of a bad one).
type failure struct {
	at        time.Time
	token     [8]byte
	unchecked bool
}

// throttle is the bad-token throttle's state. It is safe for concurrent
// use.
type throttle struct {
	mu       sync.Mutex
	failures map[string][]failure             // scope ("a "+address, "b "+block, "*") → recent failures
	known    map[string]map[[8]byte]time.Time // address → tokens that authenticated from it, and when last
}

func newThrottle() *throttle {
	return &throttle{failures: map[string][]failure{}, known: map[string]map[[8]byte]time.Time{}}
}

// scopes are the scopes a request from addr (see remoteIP) is counted in.
func scopes(addr string) (address, block string) {
	return "a " + addr, "b " + addrBlock(addr)
}

// wait returns how long requests from addr presenting token are refused
// without their token being checked; 0 when the token is to be checked.
// A refusal counts against addr.
func (t *throttle) wait(now time.Time, addr string, token [8]byte, trusted bool) time.Duration {
	if trusted {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	a, b := scopes(addr)
	var tries []time.Time
	for _, f := range t.recent(a, now) {
		if f.token == token && !f.unchecked {
			tries = append(tries, f.at)
		}
	}
	if len(tries) >= badTokenLimit {
		return tries[len(tries)-badTokenLimit].Add(badTokenWindow).Sub(now)
	}
	if w := t.over(a, hardLimit, now, true); w > 0 {
		return w
	}
	w := max(t.over(a, badTokenLimit, now, false), t.over(b, blockLimit, now, false), t.over("*", globalLimit, now, false))
	if w == 0 {
		return 0
	}
	if at, ok := t.known[addr][token]; ok && now.Sub(at) < knownFor {
		return 0
	}
	t.add(a, failure{at: now, token: token, unchecked: true}, now)
	return w
}

// fail counts a bad token from addr in each of its scopes.
func (t *throttle) fail(now time.Time, addr string, token [8]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, b := scopes(addr)
	for _, s := range []string{a, b, "*"} {
		t.add(s, failure{at: now, token: token}, now)
	}
}

// good notes that token authenticated from addr.
func (t *throttle) good(now time.Time, addr string, token [8]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.known[addr]
	if !ok {
		if len(t.known) >= maxFailureAddrs {
			for a, tokens := range t.known {
				for tok, at := range tokens {
					if now.Sub(at) >= knownFor {
						delete(tokens, tok)
					}
				}
				if len(tokens) == 0 || len(t.known) >= maxFailureAddrs {
					delete(t.known, a)
				}
				if len(t.known) < maxFailureAddrs/2 {
					break
				}
			}
		}
		m = map[[8]byte]time.Time{}
		t.known[addr] = m
	}
	m[token] = now
}

// recent returns scope's failures within the window, dropping older ones.
func (t *throttle) recent(scope string, now time.Time) []failure {
	fs := t.failures[scope]
	i := 0
	for i < len(fs) && now.Sub(fs[i].at) >= badTokenWindow {
		i++
	}
	if i == len(fs) {
		delete(t.failures, scope)
		return nil
	}
	fs = fs[i:]
	t.failures[scope] = fs
	return fs
}

// over returns how long scope stays at limit different tokens (only bad
// ones, unless unchecked too); 0 when it is below.
func (t *throttle) over(scope string, limit int, now time.Time, unchecked bool) time.Duration {
	latest := map[[8]byte]time.Time{}
	for _, f := range t.recent(scope, now) {
		if unchecked || !f.unchecked {
			latest[f.token] = f.at
		}
	}
	if len(latest) < limit {
		return 0
	}
	ends := make([]time.Time, 0, len(latest))
	for _, at := range latest {
		ends = append(ends, at)
	}
	slices.SortFunc(ends, time.Time.Compare)
	return ends[len(ends)-limit].Add(badTokenWindow).Sub(now)
}

// add records f in scope, forgetting old scopes when too many are
// remembered and the oldest failures of a scope beyond what matters.
func (t *throttle) add(scope string, f failure, now time.Time) {
	if _, ok := t.failures[scope]; !ok && len(t.failures) >= 2*maxFailureAddrs+1 {
		for s, fs := range t.failures {
			if s != "*" && (len(fs) == 0 || now.Sub(fs[len(fs)-1].at) >= badTokenWindow) {
				delete(t.failures, s)
			}
		}
		for s := range t.failures { // still full: forget one at random
			if len(t.failures) < 2*maxFailureAddrs+1 {
				break
			}
			if s != "*" {
				delete(t.failures, s)
			}
		}
	}
	fs := append(t.failures[scope], f)
	if n, most := len(fs), 4*globalLimit; n > most {
		fs = fs[n-most:] // the oldest no longer matter
	}
	t.failures[scope] = fs
}

// tokenPrint is the print of the credential r presents: its
// Authorization field, or without one its Cookie fields (a dashboard
// sign-in's cookie), so that each guessed session cookie counts as a
// different bad token, as each guessed caller token does.
func tokenPrint(r *http.Request) [8]byte {
	presented := "Authorization " + r.Header.Get("Authorization")
	if r.Header.Get("Authorization") == "" {
		if cookies := r.Header.Values("Cookie"); len(cookies) > 0 {
			presented = "Cookie " + strings.Join(cookies, "; ")
		}
	}
	sum := sha256.Sum256([]byte(presented))
	return [8]byte(sum[:8])
}

// remoteIP is the address bad tokens are counted by: the client's IPv4
// address, or its IPv6 /64 (one host commonly holds a whole /64); ::1 is
// itself, so that its block is the loopback one (its /64 is ::/64, which
// is not loopback).
func remoteIP(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	a := ap.Addr().Unmap()
	if a.Is6() && !a.IsLoopback() {
		p, _ := a.WithZone("").Prefix(64)
		return p.String()
	}
	return a.String()
}

// addrBlock is the block an address (as remoteIP gives it) belongs to:
// "loopback" for every loopback address, an IPv4 /24, an IPv6 /48.
func addrBlock(addr string) string {
	if p, err := netip.ParsePrefix(addr); err == nil { // an IPv6 /64
		if p.Addr().IsLoopback() {
			return "loopback"
		}
		b, _ := p.Addr().Prefix(48)
		return b.String()
	}
	a, err := netip.ParseAddr(addr)
	switch {
	case err != nil:
		return addr
	case a.IsLoopback():
		return "loopback"
	case a.Is4():
		b, _ := a.Prefix(24)
		return b.String()
	}
	b, _ := a.Prefix(48)
	return b.String()
}

// connTrust is what one connection proved: the tokens that authenticated
// on it. NewServer puts one in every connection's context.
type connTrust struct {
	mu     sync.Mutex
	tokens [][8]byte
}

type connKey struct{}

// withConnTrust is the http.Server ConnContext that gives each
// connection its connTrust.
func withConnTrust(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, &connTrust{})
}

// trusted reports whether token already authenticated on r's connection.
func trusted(r *http.Request, token [8]byte) bool {
	ct, ok := r.Context().Value(connKey{}).(*connTrust)
	if !ok {
		return false
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return slices.Contains(ct.tokens, token)
}

// trust notes that token authenticated on r's connection.
func trust(r *http.Request, token [8]byte) {
	ct, ok := r.Context().Value(connKey{}).(*connTrust)
	if !ok {
		return
	}
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if !slices.Contains(ct.tokens, token) && len(ct.tokens) < 16 {
		ct.tokens = append(ct.tokens, token)
	}
}
