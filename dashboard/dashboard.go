// Package dashboard is mcp-quota's page for people: GET / shows each
// key's shared budget filling and draining, who spends it, and when and
// why calls were refused, updated live by short polling of its JSON
// endpoints under /ui/api/. The page, its script and its styles are
// embedded in the binary (no CDN, no build step; it works offline).
//
// Access follows the gateway's walls. On a loopback listener without
// [[callers]] every request is the local user and the page opens
// directly. With callers, a person signs in once with a caller token
// (sent as a bearer token, so the gateway checks and throttles it like
// any other); the page then holds an HttpOnly, SameSite=Strict session
// cookie, never the token, and sees only the keys that caller may use.
// With [oauth], a person may sign in with the authorization server
// instead (the sign-in card's button, see OIDC); such a person sees the
// keys they may use or see and, on them, only the calls of the
// principals they may see (keystore.Sight): in the activity, the call
// detail and who spends it (the others are summed without names); the
// budgets and the timeline are the key's, counts without names. An
// administrator sees every call. The cookie reads the page's data and /v1/activity and /v1/quota, and
// writes (signing out) only with the session's anti-forgery token. The
// page never shows a credential.
package dashboard

import (
	"context"
	"embed"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/rest"
)

//go:embed static
var static embed.FS

// Config is what the dashboard shows. Keys, Pacer and DB are required.
type Config struct {
	Keys  *keystore.Store
	Pacer *pacer.Pacer
	DB    ledger.Viewer
	Log   *slog.Logger // nil means discard
	// Clock is the time it reads; nil means real time.
	Clock clock.Clock
	// OIDC, when set, adds the sign-in with the OAuth authorization
	// server beside the sign-in with a caller token.
	OIDC *OIDC
	// Secure reports whether a request reached mcp-quota over HTTPS, so
	// that the session cookie is marked Secure (gateway.Secure says so
	// behind a trusted TLS proxy too); nil means on a TLS listener only.
	Secure func(*http.Request) bool
}

// A Handler serves the dashboard. Create it with New; it is a
// gateway.Dashboard. It is safe for concurrent use.
type Handler struct {
	c        Config
	mux      *http.ServeMux
	sessions *sessions
	client   registered // the client registered at the authorization server, when OIDC has no ClientID
}

// New returns the dashboard for c.
func New(c Config) *Handler {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	c.Clock = clock.Or(c.Clock)
	h := &Handler{c: c, mux: http.NewServeMux(), sessions: &sessions{clock: c.Clock, m: map[[32]byte]*session{}}}
	files, _ := fs.Sub(static, "static")
	h.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		page, _ := fs.ReadFile(files, "index.html")
		secureHeaders(w)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(page)
	})
	fileServer := http.StripPrefix("/ui/static/", http.FileServerFS(files))
	h.mux.HandleFunc("GET /ui/static/", func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w)
		fileServer.ServeHTTP(w, r)
	})
	h.mux.HandleFunc("GET /ui/api/session", h.whoami)
	h.mux.HandleFunc("POST /ui/api/session", h.signIn)
	h.mux.HandleFunc("POST /ui/api/signout", h.signOut)
	h.mux.HandleFunc("GET /ui/api/overview", h.overview)
	h.mux.HandleFunc("GET /ui/api/call", h.call)
	h.oidcRoutes()
	h.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		rest.WriteProblem(w, http.StatusNotFound, rest.CodeBadRequest, "The dashboard has no such page.", nil)
	})
	return h
}

// secureHeaders keep the page to its own origin: its script and styles
// only, no framing, no referrer.
func secureHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// ServeHTTP serves the page and its data.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.c.Secure != nil && h.c.Secure(r) {
		r = r.WithContext(context.WithValue(r.Context(), secureKey{}, true))
	}
	h.mux.ServeHTTP(w, r)
}

// Open reports whether r asks for the page or its static files, which
// show no data and need no caller.
func (h *Handler) Open(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if h.c.OIDC != nil && (r.URL.Path == SignInPath || r.URL.Path == CallbackPath) {
		return true
	}
	return r.URL.Path == "/" || r.URL.Path == SignInOptionsPath || strings.HasPrefix(r.URL.Path, "/ui/static/")
}

// Session returns the caller r's session cookie signed in, when r is a
// request such a cookie may make (see the package comment).
func (h *Handler) Session(r *http.Request) (*keystore.Caller, bool) {
	se, ok := h.sessions.find(r)
	if !ok || !se.allows(r) {
		return nil, false
	}
	return se.caller, true
}
