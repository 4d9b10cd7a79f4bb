package dashboard

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report"
	"github.com/mcp-quota/mcp-quota/rest"
)

// me is GET /ui/api/session's answer: who the page acts as.
type me struct {
	Caller   string   `json:"caller"`
	Keys     []string `json:"keys"`           // the keys the page shows
	Everyone bool     `json:"sees_everyone"`  // every caller's calls of those keys, or only some principals'
	SignedIn bool     `json:"signed_in"`      // by a session cookie (else: the local user, or a bearer token)
	CSRF     string   `json:"csrf,omitempty"` // the token the page's writes carry in X-CSRF-Token
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	enc.Encode(v)
}

// visible are the keys the page shows c: those it may use, and those
// whose calls it may see (see keystore.Sight).
func (h *Handler) visible(c *keystore.Caller) []*keystore.Key {
	var out []*keystore.Key
	for _, k := range h.c.Keys.Keys() {
		if c.MaySeeKey(k.Name) {
			out = append(out, k)
		}
	}
	return out
}

func names(keys []*keystore.Key) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k.Name)
	}
	return out
}

func (h *Handler) caller(w http.ResponseWriter, r *http.Request) (*keystore.Caller, bool) {
	c, ok := keystore.CallerFrom(r.Context())
	if !ok {
		rest.WriteProblem(w, http.StatusUnauthorized, rest.CodeUnauthorized, "Sign in with a caller token.", nil)
	}
	return c, ok
}

// whoami serves GET /ui/api/session.
func (h *Handler) whoami(w http.ResponseWriter, r *http.Request) {
	c, ok := h.caller(w, r)
	if !ok {
		return
	}
	out := me{Caller: c.Name, Keys: names(h.visible(c)), Everyone: c.SeesEveryone()}
	if se, ok := h.sessions.find(r); ok && se.caller == c {
		out.SignedIn, out.CSRF = true, se.csrf
	}
	writeJSON(w, out)
}

// signIn serves POST /ui/api/session: the gateway authenticated its bearer
// token; the browser gets a session cookie for that caller instead of
// keeping the token.
func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	c, ok := h.caller(w, r)
	if !ok {
		return
	}
	if r.Header.Get("Authorization") == "" {
		rest.WriteProblem(w, http.StatusBadRequest, rest.CodeBadRequest, "Sign in with Authorization: Bearer <caller token>.", nil)
		return
	}
	h.sessions.end(r)
	id, se := h.sessions.start(c)
	setCookie(w, r, id, int(SessionLifetime.Seconds()))
	h.c.Log.Info("dashboard sign-in", "caller", c.Name)
	writeJSON(w, me{Caller: c.Name, Keys: names(h.visible(c)), Everyone: c.SeesEveryone(), SignedIn: true, CSRF: se.csrf})
}

// signOut serves POST /ui/api/signout.
func (h *Handler) signOut(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.caller(w, r); !ok {
		return
	}
	h.sessions.end(r)
	setCookie(w, r, "", -1)
	w.WriteHeader(http.StatusNoContent)
}

// A keyLine is one key in the list, the most constrained first (in
// report.Build's order, as quota_status lists them).
type keyLine struct {
	Key       string  `json:"key"`
	Action    string  `json:"action"`
	Policy    string  `json:"policy"`
	Limit     int64   `json:"limit"`
	Remaining int64   `json:"remaining"`
	ResetS    int64   `json:"reset_s"`
	Used      float64 `json:"used"` // the share of the tightest budget spent, 0…1; -1 when unknown
}

// overviewPage is GET /ui/api/overview's answer.
type overviewPage struct {
	Now    string    `json:"now"`
	Keys   []keyLine `json:"keys"`
	Detail *detail   `json:"detail,omitempty"`
}

// overview serves GET /ui/api/overview[?key=]: the caller's keys, tightest
// first, and the detail of the one named (or the tightest).
func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	c, ok := h.caller(w, r)
	if !ok {
		return
	}
	keys := h.visible(c)
	now := h.c.Clock.Now()
	st, err := report.Build(r.Context(), h.c.Pacer, keys, c, now)
	if err != nil {
		h.c.Log.Error("dashboard overview failed", "error", err)
		rest.WriteProblem(w, http.StatusInternalServerError, rest.CodeInternal, "The state file could not be read.", nil)
		return
	}
	out := overviewPage{Now: now.UTC().Format(time.RFC3339Nano), Keys: []keyLine{}}
	byName := map[string]report.KeyStatus{}
	for _, ks := range st.Keys {
		byName[ks.Key] = ks
		q := ks.Quota
		used := -1.0
		if q.Limit > 0 && q.Remaining >= 0 {
			used = 1 - float64(q.Remaining)/float64(q.Limit)
		}
		out.Keys = append(out.Keys, keyLine{Key: ks.Key, Action: ks.Advice.Action, Policy: q.Policy, Limit: q.Limit,
			Remaining: q.Remaining, ResetS: q.ResetS, Used: used})
	}
	name := r.URL.Query().Get("key")
	if name == "" && len(out.Keys) > 0 {
		name = out.Keys[0].Key
	}
	if ks, ok := byName[name]; ok {
		var k *keystore.Key
		for _, kk := range keys {
			if kk.Name == name {
				k = kk
			}
		}
		d, err := h.detail(r, c, k, ks, now)
		if err != nil {
			h.c.Log.Error("dashboard detail failed", "key", name, "error", err)
			rest.WriteProblem(w, http.StatusInternalServerError, rest.CodeInternal, "The state file could not be read.", nil)
			return
		}
		out.Detail = d
	} else if name != "" {
		rest.WriteProblem(w, http.StatusNotFound, rest.CodeUnknownKey, "There is no such key among the keys you may see.", nil)
		return
	}
	writeJSON(w, out)
}

// callPage is GET /ui/api/call's answer: a call's attempts, each with the
// observations its answer produced.
type callPage struct {
	Call     string        `json:"call"`
	Attempts []callAttempt `json:"attempts"`
}

type callAttempt struct {
	report.Activity
	SentAt       string        `json:"sent_at,omitempty"`
	AnsweredAt   string        `json:"answered_at,omitempty"`
	Observations []observation `json:"observations"`
}

// observation is what one answer said about one policy.
type observation struct {
	Policy     string `json:"policy"`
	Unit       string `json:"unit"`
	Partition  string `json:"partition,omitempty"`
	Q          *int64 `json:"q"`
	W          *int64 `json:"w"`
	R          *int64 `json:"r"`
	T          *int64 `json:"t"`
	Source     string `json:"source" jsonschema:"the header shape it was read from"`
	Profile    string `json:"profile,omitempty"`
	Guessed    bool   `json:"guessed,omitempty"`
	FromCache  bool   `json:"from_cache,omitempty"`
	Status     int    `json:"status"`
	ReceivedAt string `json:"received_at"`
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func ptr(v int64, ok bool) *int64 {
	if !ok {
		return nil
	}
	return &v
}

// call serves GET /ui/api/call?key=&call=.
func (h *Handler) call(w http.ResponseWriter, r *http.Request) {
	c, ok := h.caller(w, r)
	if !ok {
		return
	}
	key, id := r.URL.Query().Get("key"), r.URL.Query().Get("call")
	// A call of a principal c may not see is answered as one that does
	// not exist: the answer tells nothing of whether it does.
	notFound := func() {
		rest.WriteProblem(w, http.StatusNotFound, rest.CodeUnknownKey, "Name a key you may see and a call of it you may see: ?key=…&call=….", nil)
	}
	if key == "" || id == "" || !c.MaySeeKey(key) {
		notFound()
		return
	}
	hidden := false
	out := callPage{Call: id, Attempts: []callAttempt{}}
	err := h.c.DB.View(r.Context(), func(tx ledger.ReadTx) error {
		list, err := tx.Call(key, id)
		if err != nil {
			return err
		}
		for _, a := range list {
			if !c.MaySee(a.Caller) {
				hidden = true
				return nil
			}
			ca := callAttempt{Activity: report.NewActivity(a), SentAt: stamp(a.SentAt), AnsweredAt: stamp(a.AnsweredAt), Observations: []observation{}}
			obs, err := tx.ObservationsOf(key, a.ID)
			if err != nil {
				return err
			}
			for _, o := range obs {
				ca.Observations = append(ca.Observations, observation{Policy: o.Policy, Unit: string(o.Unit), Partition: o.Partition,
					Q: ptr(o.Quota, o.HasQuota), W: ptr(int64(o.Window.Seconds()), o.Window > 0), R: ptr(o.Remaining, o.HasRemaining),
					T: ptr(report.Seconds(o.Reset), o.HasReset), Source: string(o.Shape), Profile: string(o.Profile), Guessed: o.Guessed,
					FromCache: o.FromCache, Status: o.Status, ReceivedAt: stamp(o.ReceivedAt)})
			}
			out.Attempts = append(out.Attempts, ca)
		}
		return nil
	})
	if err != nil {
		h.c.Log.Error("dashboard call failed", "error", err)
		rest.WriteProblem(w, http.StatusInternalServerError, rest.CodeInternal, "The state file could not be read.", nil)
		return
	}
	if hidden || len(out.Attempts) == 0 {
		notFound()
		return
	}
	writeJSON(w, out)
}
