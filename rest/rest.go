// Package rest is mcp-quota's REST side, for sync jobs, scripts and other
// services: /k/{key}/{path...} forwards to the key's upstream with the
// key's credential, under the same shared budget as the MCP tools, and
// answers with the upstream's response plus RateLimit-Policy, RateLimit
// and X-RateLimit-* describing the shared budget — or, when it is spent,
// with a 429, Retry-After and an RFC 9457 problem, having sent nothing.
// GET /v1/quota and GET /v1/activity report the budget and the activity.
package rest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/state"
	"github.com/mcp-quota/mcp-quota/upstream"
)

// Limits bound the REST side. A zero field means its default.
type Limits struct {
	MaxBody        int64         // 32 MiB: larger request bodies get 413
	ReplayableBody int64         // 1 MiB: bodies up to this are buffered, so retries can resend them
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
type Handler struct {
	Keys   *keystore.Store
	Client *upstream.Client
	Pacer  *pacer.Pacer
	DB     *state.DB
	Log    *slog.Logger // nil means discard
	Limits Limits
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h *Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Log
}

// Routes registers the REST routes on mux.
func (h *Handler) Routes(mux *http.ServeMux) {
	mux.HandleFunc("/k/", h.forward)
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
	k, err := h.Keys.Key(name)
	if err != nil || name == "" {
		writeProblem(w, http.StatusNotFound, CodeUnknownKey, fmt.Sprintf("There is no key %q. Keys you may use: %s.", name, strings.Join(usable(h.Keys, caller), ", ")), nil)
		return nil, nil, false
	}
	if !caller.MayUse(k.Name) {
		writeProblem(w, http.StatusForbidden, CodeForbidden, fmt.Sprintf("Caller '%s' may not use key '%s'.", caller.Name, k.Name), nil)
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

// forward serves /k/{key}/{path...}.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request) {
	lim := h.Limits.withDefaults()
	name, path, _ := strings.Cut(strings.TrimPrefix(r.URL.EscapedPath(), "/k/"), "/")
	k, caller, ok := h.key(w, r, name)
	if !ok {
		return
	}
	if r.ContentLength > lim.MaxBody {
		writeProblem(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
			fmt.Sprintf("The request body is %d bytes; the most mcp-quota forwards is %d.", r.ContentLength, lim.MaxBody), nil)
		return
	}
	wait, applied := preferWait(r.Header, lim)
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	req := upstream.Request{Caller: caller.Name, Transport: "rest", Method: r.Method, Path: "/" + path,
		Header: r.Header, MaxWait: wait, AllMethods: true, ContentLength: r.ContentLength}
	body := http.MaxBytesReader(w, r.Body, lim.MaxBody)
	switch {
	case r.ContentLength == 0 || r.Body == http.NoBody:
		req.Body = nil
	case r.ContentLength > 0 && r.ContentLength <= lim.ReplayableBody:
		b, err := io.ReadAll(body)
		if err != nil {
			h.bodyError(w, err)
			return
		}
		req.Body = b
	default:
		req.Body = body // streamed once; never retried
	}
	resp, err := h.Client.Do(r.Context(), k, req)
	if err != nil {
		h.failed(w, r, k, caller, err)
		return
	}
	defer resp.Body.Close()
	hdr := w.Header()
	copyResponseHeaders(hdr, resp.Header)
	ratelimit.SetHeaders(hdr, limits(resp.Result.Budgets))
	if applied != "" {
		hdr.Set("Preference-Applied", applied)
	}
	w.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead {
		return
	}
	if _, err := copyFlushing(w, resp.Body); err != nil {
		h.log().Debug("streaming an answer ended early", "key", k.Name, "error", err)
	}
}

// failed answers a call that got no answer from the upstream.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, k *keystore.Key, caller *keystore.Caller, err error) {
	var pe *pacer.PauseError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &pe):
		st, serr := h.Pacer.Status(r.Context(), k, caller.Name)
		if serr == nil {
			ratelimit.SetHeaders(w.Header(), limits(append(st.Local, st.Upstream...)))
		}
		ratelimit.SetRetryAfter(w.Header(), pe.RetryAfter)
		secs := report.Seconds(pe.RetryAfter)
		ext := map[string]any{"type": ratelimit.ProblemQuotaExceeded, "key": k.Name, "retry_after_s": secs}
		if pe.Binding != nil {
			ext["violated-policies"] = []string{pe.Binding.Policy}
		}
		writeProblem(w, http.StatusTooManyRequests, CodeRateLimited,
			fmt.Sprintf("Key '%s': %s. Nothing was sent upstream. Try again in %d seconds; the RateLimit header says what is left.", k.Name, pe.Reason, secs), ext)
	case errors.As(err, &tooLarge):
		h.bodyError(w, err)
	case errors.Is(err, upstream.ErrBadPath):
		writeProblem(w, http.StatusBadRequest, CodeBadRequest, sentence(err.Error()), nil)
	case errors.Is(err, keystore.ErrNoCredential):
		writeProblem(w, http.StatusServiceUnavailable, CodeUpstreamUnavailable, sentence(err.Error()), nil)
	case errors.Is(err, upstream.ErrForbiddenAddress):
		writeProblem(w, http.StatusBadGateway, CodeUpstreamUnavailable, sentence(err.Error()), nil)
	case r.Context().Err() != nil:
		// The caller went away; there is no one to answer.
	default:
		writeProblem(w, http.StatusBadGateway, CodeUpstreamUnavailable, sentence(err.Error()), nil)
	}
}

func (h *Handler) bodyError(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
			fmt.Sprintf("The request body is larger than %d bytes, the most mcp-quota forwards.", tooLarge.Limit), nil)
		return
	}
	writeProblem(w, http.StatusBadRequest, CodeBadRequest, "The request body could not be read.", nil)
}

// preferWait reads Prefer: wait=N (RFC 7240): how long the caller will be
// held for the budget instead of refused.
func preferWait(h http.Header, lim Limits) (time.Duration, string) {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(strings.TrimSpace(pref), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.ParseFloat(strings.Trim(strings.TrimSpace(val), `"`), 64)
			if err != nil || n < 0 {
				continue
			}
			d := min(time.Duration(n*float64(time.Second)), lim.MaxWait)
			return d, "wait=" + strconv.FormatInt(report.Seconds(d), 10)
		}
	}
	return lim.DefaultWait, ""
}

// limits turns budgets into the limits the response headers announce:
// every budget whose remaining is known.
func limits(bs []pacer.Budget) []ratelimit.Limit {
	var out []ratelimit.Limit
	seen := map[string]bool{}
	for _, b := range bs {
		if b.Remaining < 0 || b.Limit <= 0 || (b.Unit != "" && b.Unit != ratelimit.Requests) {
			continue
		}
		id := b.Policy + "\x00" + b.Partition
		l := ratelimit.Limit{Policy: b.Policy, Unit: b.Unit, Quota: b.Limit, Window: b.Window, Remaining: b.Remaining, Reset: b.Reset}
		if seen[id] { // a policy both documented and announced: keep the tighter
			for i := range out {
				if out[i].Policy == b.Policy && (l.Remaining < out[i].Remaining || (l.Remaining == out[i].Remaining && l.Reset > out[i].Reset)) {
					out[i] = l
				}
			}
			continue
		}
		seen[id] = true
		out = append(out, l)
	}
	return out
}

// responseHopByHop are the response fields a proxy does not pass on.
var responseHopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Set-Cookie": true}

func copyResponseHeaders(dst, src http.Header) {
	drop := map[string]bool{}
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(f))] = true
		}
	}
	for name, vs := range src {
		c := http.CanonicalHeaderKey(name)
		if responseHopByHop[c] || drop[c] {
			continue
		}
		dst[c] = append(dst[c][:0:0], vs...)
	}
}

// copyFlushing streams src to w, flushing as it goes so a slow upstream's
// answer reaches the caller as it arrives.
func copyFlushing(w http.ResponseWriter, src io.Reader) (int64, error) {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	var n int64
	for {
		m, err := src.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
			_ = rc.Flush()
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
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
	st, err := report.Build(r.Context(), h.Pacer, keys, caller.Name, h.now())
	if err != nil {
		h.log().Error("quota status failed", "error", err)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "The state file could not be read.", nil)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// activityPage is GET /v1/activity's answer.
type activityPage struct {
	Activity   []report.Activity `json:"activity"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// activity serves GET /v1/activity?key=&since=&limit=&cursor=.
func (h *Handler) activity(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	caller, ok := keystore.CallerFrom(r.Context())
	if !ok {
		writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "A caller token is required.", nil)
		return
	}
	f := state.ActivityFilter{Limit: 50}
	if name := q.Get("key"); name != "" {
		if _, _, ok := h.key(w, r, name); !ok {
			return
		}
		f.Key = name
	} else if !caller.MayUse("*") {
		writeProblem(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("Name a key: ?key=%s.", usable(h.Keys, caller)[0]), nil)
		return
	}
	if s := q.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, CodeBadRequest, "since must be an RFC 3339 time, like 2026-11-30T12:00:00Z.", nil)
			return
		}
		f.Since = t
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, http.StatusBadRequest, CodeBadRequest, "limit must be a whole number from 1 to 1000.", nil)
			return
		}
		f.Limit = n
	}
	if s := q.Get("cursor"); s != "" {
		id, err := decodeCursor(s)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, CodeBadRequest, "cursor is not one this server gave out.", nil)
			return
		}
		f.Before = id
	}
	var list []state.Attempt
	err := h.DB.View(r.Context(), func(tx *state.Tx) error {
		var err error
		list, err = tx.Activity(f)
		return err
	})
	if err != nil {
		h.log().Error("activity failed", "error", err)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "The state file could not be read.", nil)
		return
	}
	out := activityPage{Activity: make([]report.Activity, 0, len(list))}
	for _, a := range list {
		out.Activity = append(out.Activity, report.NewActivity(a))
	}
	if len(list) == f.Limit {
		out.NextCursor = encodeCursor(list[len(list)-1].ID)
	}
	writeJSON(w, http.StatusOK, out)
}

func encodeCursor(id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("a" + strconv.FormatInt(id, 10)))
}

func decodeCursor(s string) (int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 2 || b[0] != 'a' {
		return 0, errors.New("bad cursor")
	}
	return strconv.ParseInt(string(b[1:]), 10, 64)
}

// Health serves GET /healthz: ok when the state file answers.
func Health(db *state.DB) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := db.View(ctx, func(tx *state.Tx) error { _, err := tx.Keys(); return err }); err != nil {
			writeProblem(w, http.StatusServiceUnavailable, CodeInternal, "The state file does not answer.", nil)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	writeBody(w, status, "application/json", v)
}

func writeBody(w http.ResponseWriter, status int, contentType string, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// sentence capitalises s and ends it with a full stop.
func sentence(s string) string {
	if s == "" {
		return s
	}
	if s[0] >= 'a' && s[0] <= 'z' {
		s = string(s[0]-'a'+'A') + s[1:]
	}
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}
