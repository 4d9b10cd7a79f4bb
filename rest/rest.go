// Package rest is mcp-quota's REST side, for sync jobs, scripts and other
// services: /k/{key}/{path...} forwards to the key's upstream with the
// key's credential, under the same shared budget as the MCP tools, and
// answers with the upstream's answer — its Link, Location and
// Content-Location pointed back at /k/{key}/, hop-by-hop fields dropped —
// plus RateLimit-Policy, RateLimit and X-RateLimit-* describing the
// tighter of the shared budget and what the upstream said; or, when the
// budget is spent, with a 429, Retry-After and an RFC 9457 problem,
// having sent nothing. GET /v1/quota and GET /v1/activity report the
// budget and the activity. Every error is a problem with a stable code
// (see the Code constants).
package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// Limits bound the REST side. A zero field means its default.
type Limits struct {
	MaxBody int64 // 32 MiB: larger request bodies get 413
	// ReplayableBody is 1 MiB: bodies up to this are buffered, so retries
	// can resend them; larger ones stream to the upstream as they arrive
	// and their calls are never retried.
	ReplayableBody int64
	DefaultWait    time.Duration // 5 s: how long a call waits for the budget without Prefer: wait
	MaxWait        time.Duration // 120 s: the most Prefer: wait may ask for
}

func (l Limits) withDefaults() Limits {
	if l.MaxBody <= 0 {
		l.MaxBody = 32 << 20
	}
	if l.ReplayableBody <= 0 {
		l.ReplayableBody = 1 << 20
	}
	if l.DefaultWait <= 0 {
		l.DefaultWait = 5 * time.Second
	}
	if l.MaxWait <= 0 {
		l.MaxWait = 120 * time.Second
	}
	return l
}

// Handler serves the REST side. Requests must carry the authenticated
// caller in their context (keystore.WithCaller); the gateway puts it there.
// Keys, Client, Pacer and DB are required. A Handler is safe for
// concurrent use; do not change its fields once it serves.
type Handler struct {
	Keys   *keystore.Store
	Client *upstream.Client
	Pacer  *pacer.Pacer
	DB     ledger.Viewer
	Log    *slog.Logger // nil means discard
	Limits Limits
	// Clock is the time it reads; nil means real time.
	Clock clock.Clock
}

func (h *Handler) now() time.Time {
	return clock.Or(h.Clock).Now()
}

func (h *Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Log
}

// Routes registers the REST routes on mux. A ServeMux cleans paths
// before routing (it redirects /k/demo/a/../b to /k/demo/b), so a
// listener that wants "..", "//" and their encodings refused as bad
// requests sends /k/ paths to Forward itself, as the gateway does.
func (h *Handler) Routes(mux *http.ServeMux) {
	mux.HandleFunc("/k/", h.Forward)
	mux.HandleFunc("GET /v1/quota", h.quota)
	mux.HandleFunc("GET /v1/activity", h.activity)
}

// key resolves and authorizes the key a request names.
func (h *Handler) key(w http.ResponseWriter, r *http.Request, name string) (*keystore.Key, *keystore.Caller, bool) {
	caller, ok := keystore.CallerFrom(r.Context())
	if !ok {
		writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "A caller token is required: send Authorization: Bearer <token>.", nil)
		return nil, nil, false
	}
	// A key the caller may not use is answered as one that does not
	// exist: its name tells nothing.
	k, err := h.Keys.Key(name)
	if err != nil || name == "" || !caller.MayUse(k.Name) {
		writeProblem(w, http.StatusNotFound, CodeUnknownKey, fmt.Sprintf("There is no key %q. Keys you may use: %s.", name, strings.Join(usable(h.Keys, caller), ", ")), nil)
		return nil, nil, false
	}
	return k, caller, true
}

func usable(s *keystore.Store, c *keystore.Caller) []string {
	var out []string
	for _, k := range s.Keys() {
		if c.MayUse(k.Name) {
			out = append(out, k.Name)
		}
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// quota serves GET /v1/quota[?key=]: what quota_status returns.
func (h *Handler) quota(w http.ResponseWriter, r *http.Request) {
	caller, ok := keystore.CallerFrom(r.Context())
	if !ok {
		writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "A caller token is required.", nil)
		return
	}
	var keys []*keystore.Key
	if name := r.URL.Query().Get("key"); name != "" {
		k, _, ok := h.key(w, r, name)
		if !ok {
			return
		}
		keys = []*keystore.Key{k}
	} else {
		for _, k := range h.Keys.Keys() {
			if caller.MayUse(k.Name) {
				keys = append(keys, k)
			}
		}
	}
	st, err := report.Build(r.Context(), h.Pacer, keys, caller, h.now())
	if err != nil {
		h.log().Error("quota status failed", "error", err)
		writeProblem(w, http.StatusServiceUnavailable, CodeStateUnavailable, report.Unavailable(err)+"; GET /healthz says why.", nil)
		return
	}
	writeJSON(w, http.StatusOK, st) // every key, the most constrained first, as quota_status lists them
}

// activity serves GET /v1/activity?key=&since=&limit=&cursor=.
func (h *Handler) activity(w http.ResponseWriter, r *http.Request) {
	caller, ok := keystore.CallerFrom(r.Context())
	if !ok {
		writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "A caller token is required.", nil)
		return
	}
	f, ok := h.activityFilter(w, r, caller)
	if !ok {
		return
	}
	var list []ledger.Attempt
	var next ledger.Cursor
	err := h.DB.View(r.Context(), func(tx ledger.ReadTx) error {
		var err error
		list, next, err = seenActivity(tx, f, caller)
		return err
	})
	if err != nil {
		h.log().Error("activity failed", "error", err)
		writeProblem(w, http.StatusServiceUnavailable, CodeStateUnavailable, report.Unavailable(err)+"; GET /healthz says why.", nil)
		return
	}
	out := report.ActivityPage{Activity: make([]report.Activity, 0, len(list))}
	for _, a := range list {
		// Rows an older mcp-quota recorded may hold the credential.
		if k, err := h.Keys.Key(a.Key); err == nil {
			s := k.Scrubber()
			a.Target, _ = s.Scrub(a.Target)
			a.Reason = a.Reason.Map(func(t string) string { t, _ = s.Scrub(t); return t })
		}
		out.Activity = append(out.Activity, report.NewActivity(a))
	}
	if !next.IsZero() {
		text, _ := next.MarshalText() // a Cursor's text cannot fail
		out.NextCursor = string(text)
	}
	writeJSON(w, http.StatusOK, out)
}

// activityFilter reads the activity's query (key, since, limit, cursor)
// as caller may ask it; it returns false when it wrote a problem instead.
func (h *Handler) activityFilter(w http.ResponseWriter, r *http.Request, caller *keystore.Caller) (ledger.ActivityFilter, bool) {
	q := r.URL.Query()
	f := ledger.ActivityFilter{Limit: 50}
	if name := q.Get("key"); name != "" {
		// The activity of a key is read by who may see it (see
		// keystore.Sight), not only by who may use it.
		if k, err := h.Keys.Key(name); err != nil || !caller.MaySeeKey(k.Name) {
			if _, _, ok := h.key(w, r, name); !ok {
				return f, false
			}
		}
		f.Key = name
	} else if !caller.MaySeeKey("*") {
		writeProblem(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("Name a key: ?key=%s.", usable(h.Keys, caller)[0]), nil)
		return f, false
	}
	if s := q.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, CodeBadRequest, "since must be an RFC 3339 time, like 2026-11-30T12:00:00Z.", nil)
			return f, false
		}
		f.Since = t
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, http.StatusBadRequest, CodeBadRequest, "limit must be a whole number from 1 to 1000.", nil)
			return f, false
		}
		f.Limit = n
	}
	if s := q.Get("cursor"); s != "" {
		if err := f.Cursor.UnmarshalText([]byte(s)); err != nil {
			writeProblem(w, http.StatusBadRequest, CodeBadRequest, "cursor is not one this server gave out.", nil)
			return f, false
		}
	}
	return f, true
}

// A Checker reports whether the state is usable.
type Checker interface {
	Check(ctx context.Context) error
}

// Health serves GET /healthz: ok, with the program's version when it is
// not empty, when the state answers and took its last write (a SQLite
// file also passes quick_check; see state.DB.Check); otherwise 503
// stateUnavailable, saying which failed — of "the state file" or, for a
// state that names its database (a Where method, as state.Postgres has),
// of "the state database".
// A db that also has a method Detail() map[string]any adds what it
// returns to the ok answer.
func Health(db Checker, version string) http.HandlerFunc {
	what := "The state file"
	if _, ok := db.(interface{ Where() string }); ok {
		what = "The state database"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := db.Check(ctx); err != nil {
			writeProblem(w, http.StatusServiceUnavailable, CodeStateUnavailable,
				reason.Sentence(what+" cannot be used: "+strings.TrimPrefix(err.Error(), "state: ")), map[string]any{"state": "unhealthy"})
			return
		}
		body := map[string]any{"status": "ok"}
		if version != "" {
			body["version"] = version
		}
		if d, ok := db.(interface{ Detail() map[string]any }); ok {
			for k, v := range d.Detail() {
				body[k] = v
			}
		}
		writeJSON(w, http.StatusOK, body)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, "application/json", v)
}

func writeBody(w http.ResponseWriter, status int, contentType string, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}
