// Package gateway is mcp-quota's HTTP listener: MCP over Streamable HTTP
// at /mcp and the REST side at /k/ and /v1/, behind the walls every
// request passes — a caller token (compared in constant time, bad tokens
// themselves rate limited), the Host and Origin checks that stop DNS
// rebinding and cross-site requests, a limit on each caller's concurrent
// calls, and size and time limits.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/oauth"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/rest"
)

// Config is what the gateway serves. Keys, REST, MCP and DB are required.
type Config struct {
	Keys *keystore.Store
	REST *rest.Handler
	MCP  *server.MCPServer
	DB   rest.Checker // the state, checked by GET /healthz
	// Drain turns GET /readyz unready and ends the MCP sessions when the
	// server stops; nil means /readyz answers as /healthz does.
	Drain *Drain
	Log   *slog.Logger // nil means discard

	// Loopback says the listener is bound to a loopback address: Host
	// must then name a loopback host, and, when no [[callers]] are
	// configured, requests need no token (they act as the caller "local").
	Loopback bool
	// AllowOrigins are browser origins (scheme://host:port) allowed to call.
	AllowOrigins []string
	// TrustedProxies are the reverse proxies (addresses and prefixes)
	// whose X-Forwarded-Proto and X-Forwarded-For are believed: a request
	// from one that says its client spoke HTTPS counts as secure (the
	// dashboard's cookie is Secure, its own origin is https), and the
	// client's address is the one the bad-token throttle counts by. Empty
	// means none: the fields are ignored.
	TrustedProxies []netip.Prefix
	// MaxConcurrent caps each caller's calls in flight, and apart from
	// them its MCP event streams (GET /mcp); 0 means 16.
	MaxConcurrent int
	// MaxMCPBody caps an MCP request body; 0 means 1 MiB.
	MaxMCPBody int64
	// MaxHeaderBytes caps a request's target and header fields, counted
	// as their names and values; 0 means 32 KiB. Larger requests get 431
	// and the problem code payloadTooLarge. (NewServer's MaxHeaderBytes
	// is the hard limit beyond it, answered by net/http itself.)
	MaxHeaderBytes int
	// SessionIdle ends an MCP session (of the revisions before
	// 2026-07-28) after this long without a request; 0 means
	// DefaultSessionIdle. A request naming a session that ended is
	// answered 404, and the client starts a new one.
	SessionIdle time.Duration
	// SessionSecret signs the IDs of those sessions, so that every
	// gateway holding the same secret serves every session any of them
	// opened: hosts that share a state must share it (32 random bytes
	// suffice). The zero Secret means a random secret of this process,
	// so sessions work on this host only, until it restarts.
	SessionSecret keystore.Secret
	// MaxSessions bounds the MCP sessions live on this host at once
	// (opened here, or taken up from another host); 0 means
	// DefaultMaxSessions. An initialize past it is refused with a
	// JSON-RPC error saying so.
	MaxSessions int
	// MaxSessionsPerCaller bounds one caller's live MCP sessions on this
	// host; 0 means DefaultMaxSessionsPerCaller. An initialize past it is
	// refused with a JSON-RPC error saying what to do.
	MaxSessionsPerCaller int
	// Clock is the time it reads; nil means real time.
	Clock clock.Clock
	// Version is the program's version, shown by GET /healthz; empty
	// shows none.
	Version string

	// Metrics, when set, serves GET /metrics to authenticated callers.
	Metrics http.Handler
	// Dashboard, when set, serves the page at / and /ui/.
	Dashboard Dashboard
	// OAuth, when set, makes the gateway an OAuth resource server beside
	// the static caller tokens: it serves the protected resource metadata
	// and takes access tokens of its issuers. Nil publishes nothing of
	// OAuth.
	OAuth *oauth.Server
}

// A Dashboard is a page for people, served behind the same walls as the
// API. Its page and script show no data and open to anyone who passes the
// Host and Origin walls; everything else needs a caller, who may also be
// one a browser signed in as (a session cookie the Dashboard gave out).
type Dashboard interface {
	http.Handler
	// Open reports whether r asks for what anyone may see: the page
	// itself and its script, which show nothing before a sign-in.
	Open(r *http.Request) bool
	// Session returns the caller r's session cookie signed in, when r may
	// act as that caller: the Dashboard decides which requests a cookie
	// may make (its reads; writes only with their anti-forgery token).
	Session(r *http.Request) (*keystore.Caller, bool)
}

// New returns the gateway's handler.
func New(c Config) http.Handler {
	g := newGate(c)
	c = g.c
	sessions := newMCP(c)
	mux := http.NewServeMux()
	c.REST.Routes(mux)
	mux.Handle("/mcp", mcpBodyLimit(http.HandlerFunc(sessions.serve), c.MaxMCPBody))
	health := rest.Health(c.DB, c.Version)
	mux.HandleFunc("GET /healthz", health)
	mux.HandleFunc("GET /readyz", ready(c.Drain, health))
	oauthRoutes(mux, c.OAuth)
	if c.Metrics != nil {
		mux.Handle("GET /metrics", c.Metrics)
	}
	if c.Dashboard != nil {
		mux.Handle("GET /{$}", c.Dashboard)
		mux.Handle("/ui/", c.Dashboard)
	}
	served := "/mcp (MCP), /k/{key}/… (REST), /v1/quota, /v1/activity"
	if c.Dashboard != nil {
		served += ", / (the dashboard)"
	}
	if c.Metrics != nil {
		served += ", /metrics"
	}
	notFound := "Nothing is here. mcp-quota serves " + served + ", /healthz and /readyz."
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		rest.WriteProblem(w, http.StatusNotFound, rest.CodeBadRequest, notFound, nil)
	})
	route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// REST paths go to the forwarder as they came: the mux would
		// clean "..", "//" and their encodings into a redirect, where
		// they must be refused.
		if strings.HasPrefix(r.URL.Path, "/k/") {
			c.REST.Forward(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
	return g.walls(route)
}

// newMCP returns the Streamable HTTP side of c.MCP behind the sessions
// that keep it.
func newMCP(c Config) *sessions {
	ss := newSessions(c.SessionIdle, c.Clock, c.SessionSecret)
	if c.MaxSessions > 0 {
		ss.maxTotal = c.MaxSessions
	}
	if c.MaxSessionsPerCaller > 0 {
		ss.maxPerCaller = c.MaxSessionsPerCaller
	}
	ss.mcp = server.NewStreamableHTTPServer(c.MCP,
		server.WithSessionIdManagerResolver(ss),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			if caller, ok := keystore.CallerFrom(r.Context()); ok {
				return keystore.WithCaller(ctx, caller)
			}
			return ctx
		}),
		server.WithStreamableHTTPLogger(c.Log),
	)
	if sc, ok := ss.mcp.(sessionCloser); ok && c.Drain != nil {
		c.Drain.add(sc)
	}
	return ss
}

// mcpBodyLimit answers an MCP request whose declared body is larger than
// max with 413 and the problem code payloadTooLarge, and cuts a body of
// unknown length at max (the MCP server then answers with a JSON-RPC
// parse error).
func mcpBodyLimit(next http.Handler, max int64) http.Handler {
	limited := http.MaxBytesHandler(next, max)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			w.Header().Set("Connection", "close")
			rest.WriteProblem(w, http.StatusRequestEntityTooLarge, rest.CodePayloadTooLarge,
				fmt.Sprintf("The MCP message is %d bytes; the most mcp-quota accepts is %d.", r.ContentLength, max), nil)
			return
		}
		limited.ServeHTTP(w, r)
	})
}

func newGate(c Config) *gate {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 16
	}
	if c.MaxMCPBody <= 0 {
		c.MaxMCPBody = 1 << 20
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 32 << 10
	}
	c.Clock = clock.Or(c.Clock)
	return &gate{c: c, throttle: newThrottle(), inFlight: map[string]int{}, streams: map[string]int{}}
}

// walls puts next behind every wall, in order: what a trusted proxy
// says of its client, the size of the request's header section, Host and
// Origin, the caller token (and the bad-token throttle), the caller's
// concurrency limit. Every answer, a wall's too, is marked nosniff.
func (g *gate) walls(next http.Handler) http.Handler {
	return nosniff(g.proxied(g.headerSize(g.origins(g.authenticate(next)))))
}

// headerSize refuses requests whose target and header fields are larger
// than MaxHeaderBytes.
func (g *gate) headerSize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := len(r.RequestURI) + len(r.Host)
		for name, vs := range r.Header {
			for _, v := range vs {
				n += len(name) + len(v) + 4 // ": " and CRLF
			}
		}
		if n > g.c.MaxHeaderBytes {
			w.Header().Set("Connection", "close")
			rest.WriteProblem(w, http.StatusRequestHeaderFieldsTooLarge, rest.CodePayloadTooLarge,
				fmt.Sprintf("The request's target and header fields take %d bytes; the most mcp-quota accepts is %d.", n, g.c.MaxHeaderBytes), nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// gate holds the walls' state.
type gate struct {
	c        Config
	throttle *throttle // bad tokens
	mu       sync.Mutex
	inFlight map[string]int // caller → calls in flight
	streams  map[string]int // caller → GET /mcp event streams open
}

// authenticate finds the caller of each request (except /healthz) from
// its bearer token and holds it to its concurrency limit.
func (g *gate) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || g.oauthOpen(r) || (g.c.Dashboard != nil && g.c.Dashboard.Open(r)) {
			next.ServeHTTP(w, r)
			return
		}
		ip, presented := remoteIP(r), tokenPrint(r)
		if wait := g.throttle.wait(g.c.Clock.Now(), ip, presented, trusted(r, presented)); wait > 0 {
			ratelimit.SetRetryAfter(w.Header(), wait)
			rest.WriteProblem(w, http.StatusTooManyRequests, rest.CodeRateLimited,
				"Too many requests with bad caller tokens came from this address or its network; wait before trying again.", nil)
			return
		}
		caller, ok := g.caller(r)
		if !ok && g.c.OAuth != nil {
			var done, bad bool
			caller, done, bad = g.oauthCaller(w, r)
			if bad {
				g.throttle.fail(g.c.Clock.Now(), ip, presented)
			}
			if done {
				return
			}
			ok = caller != nil
		}
		if !ok {
			g.throttle.fail(g.c.Clock.Now(), ip, presented)
			w.Header().Set("WWW-Authenticate", g.challenge(r.Header.Get("Authorization") != ""))
			detail := g.noTokenDetail()
			if r.Header.Get("Authorization") != "" {
				detail = "The caller token is not valid."
			}
			rest.WriteProblem(w, http.StatusUnauthorized, rest.CodeUnauthorized, detail, nil)
			return
		}
		g.throttle.good(g.c.Clock.Now(), ip, presented)
		trust(r, presented)
		// An MCP event stream (GET /mcp) idles for as long as the client
		// keeps it: it has slots of its own, so streams never starve calls.
		slots, what := g.inFlight, "calls in flight"
		if r.Method == http.MethodGet && r.URL.Path == "/mcp" {
			slots, what = g.streams, "MCP event streams open"
		}
		if !g.enter(slots, caller.Name) {
			ratelimit.SetRetryAfter(w.Header(), time.Second)
			rest.WriteProblem(w, http.StatusTooManyRequests, rest.CodeRateLimited,
				fmt.Sprintf("Caller '%s' has %d %s, the most allowed at once.", caller.Name, g.c.MaxConcurrent, what), nil)
			return
		}
		defer g.leave(slots, caller.Name)
		next.ServeHTTP(w, r.WithContext(keystore.WithCaller(r.Context(), caller)))
	})
}

// callerSchemes are the authentication schemes a caller token is
// accepted in: Bearer, and the ones vendor SDKs send by default — GitHub's
// "token" (octokit's auth: "<token>") and Discord's "Bot". Each is one
// guess for the bad-token throttle, like any other.
var callerSchemes = []string{"Bearer", "token", "Bot"}

// caller authenticates r. With no callers configured on a loopback
// listener, every request is the local user.
func (g *gate) caller(r *http.Request) (*keystore.Caller, bool) {
	if len(g.c.Keys.Callers()) == 0 && g.c.Loopback && g.c.OAuth == nil {
		return keystore.Local("local"), true
	}
	if r.Header.Get("Authorization") == "" && g.c.Dashboard != nil {
		return g.c.Dashboard.Session(r)
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !slices.ContainsFunc(callerSchemes, func(s string) bool { return strings.EqualFold(s, scheme) }) {
		return nil, false
	}
	return g.c.Keys.Authenticate(strings.TrimSpace(token))
}

// enter takes one of caller's MaxConcurrent slots (of calls in flight,
// or of event streams).
func (g *gate) enter(slots map[string]int, caller string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if slots[caller] >= g.c.MaxConcurrent {
		return false
	}
	slots[caller]++
	return true
}

func (g *gate) leave(slots map[string]int, caller string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if slots[caller]--; slots[caller] <= 0 {
		delete(slots, caller)
	}
}

// origins refuses requests a browser sent from another site, and, on a
// loopback listener, requests whose Host is not a loopback name (a DNS
// rebinding attack reaches 127.0.0.1 under an attacker's name). Every
// method is checked: http.CrossOriginProtection lets GET through.
func (g *gate) origins(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.c.Loopback && !loopbackHost(r.Host) {
			rest.WriteProblem(w, http.StatusForbidden, rest.CodeForbidden,
				"The Host header must name this machine (localhost, 127.0.0.1 or [::1]).", nil)
			return
		}
		origin := r.Header.Get("Origin")
		if origin != "" && origin != "null" && !g.originAllowed(origin, r) {
			rest.WriteProblem(w, http.StatusForbidden, rest.CodeForbidden,
				fmt.Sprintf("Requests from origin %s are not allowed; start mcp-quota with --allow-origin to allow it.", origin), nil)
			return
		}
		if origin == "null" || (!fetchSiteAllowed(r.Header.Values("Sec-Fetch-Site"), slices.Contains(g.c.AllowOrigins, origin)) && !signInReturn(r)) {
			rest.WriteProblem(w, http.StatusForbidden, rest.CodeForbidden, "Cross-site requests are not allowed.", nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// originAllowed reports whether origin is allow-listed, or is this very
// server's origin, compared as the Fetch standard serializes an origin
// (scheme "://" host [":" port], lower case, no default port, no path):
// exactly, so another scheme, a trailing slash or other spellings are
// other origins.
func (g *gate) originAllowed(origin string, r *http.Request) bool {
	if slices.Contains(g.c.AllowOrigins, origin) {
		return true
	}
	if g.c.Loopback && !loopbackHost(r.Host) {
		return false
	}
	return origin == ownOrigin(r)
}

// ownOrigin is the origin a browser names for pages served at r's Host
// by this listener.
func ownOrigin(r *http.Request) string {
	scheme, port := "http", "80"
	if Secure(r) {
		scheme, port = "https", "443"
	}
	host := strings.ToLower(r.Host)
	if h, p, err := net.SplitHostPort(host); err == nil && p == port {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	return scheme + "://" + host
}

// fetchSiteAllowed judges Sec-Fetch-Site, whose value is one of the
// lower-case tokens "cross-site", "same-origin", "same-site" and "none"
// (Fetch Metadata §2.4), compared exactly: cross-site only from an
// allow-listed origin, and anything else that is not one of them refused.
func fetchSiteAllowed(values []string, allowListed bool) bool {
	if len(values) == 0 {
		return true
	}
	if len(values) > 1 {
		return false
	}
	switch values[0] {
	case "same-origin", "same-site", "none":
		return true
	case "cross-site":
		return allowListed
	}
	return false
}

// loopbackHost reports whether host (with or without port) names this
// machine.
func loopbackHost(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// NewServer returns an *http.Server for h on addr with mcp-quota's
// timeouts and size limits: slow clients cannot hold connections open.
// log may be nil.
func NewServer(addr string, h http.Handler, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       5 * time.Minute,
		WriteTimeout:      10 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnContext:       withConnTrust, // a token that authenticated on a connection is never throttled on it
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}
