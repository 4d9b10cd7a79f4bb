package rest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/demo"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// windowCount is a fixed window that starts with the first call after
// the previous one ended, as GitHub's and OpenAI's do.
type windowCount struct {
	quota  int
	window time.Duration
	start  time.Time
	used   int
}

// take spends one at now; ok is false when the window is spent.
func (c *windowCount) take(now time.Time, n int) (ok bool) {
	if c.start.IsZero() || !now.Before(c.start.Add(c.window)) {
		c.start, c.used = now, 0
	}
	if c.used+n > c.quota {
		return false
	}
	c.used += n
	return true
}

// ghStandIn is a GitHub-like upstream: GET /user under a primary limit
// of quota calls per window (GitHub's fields, its epoch reset in whole
// seconds, the second the window ends in) and a secondary limit on
// calls in flight, refused as GitHub refuses them. The call numbered
// secondaryAt (from 1) meets the secondary limit too.
type ghStandIn struct {
	secret string

	mu          sync.Mutex
	primary     windowCount
	inFlight    int
	maxInFlight int
	secondaryAt int
	refusals    []string // every refusal it answered
	calls       int
}

func newGHStandIn(secret string, quota int, window time.Duration) *ghStandIn {
	return &ghStandIn{secret: secret, primary: windowCount{quota: quota, window: window}, maxInFlight: 3}
}

func (g *ghStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+g.secret {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	now := time.Now()
	g.mu.Lock()
	g.calls++
	g.inFlight++
	defer func() { g.mu.Lock(); g.inFlight--; g.mu.Unlock() }()
	secondary := g.inFlight > g.maxInFlight || g.calls == g.secondaryAt
	ok := g.primary.take(now, 0) // the window rolls on whatever the answer
	if !secondary {
		ok = g.primary.take(now, 1)
	}
	remaining := g.primary.quota - g.primary.used
	// GitHub names the second the window ends in.
	reset := g.primary.start.Add(g.primary.window).Unix()
	if secondary || !ok {
		g.refusals = append(g.refusals, fmt.Sprintf("secondary=%v remaining=%d at %s (window from %s)", secondary, remaining, now.Format("05.000"), g.primary.start.Format("05.000")))
	}
	g.mu.Unlock()

	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("X-RateLimit-Limit", strconv.Itoa(g.primary.quota))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
	h.Set("X-RateLimit-Used", strconv.Itoa(g.primary.quota-remaining))
	h.Set("X-RateLimit-Resource", "core")
	switch {
	case secondary:
		h.Set("Retry-After", "5")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{
			"message":           "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
			"documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"})
	case !ok:
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{
			"message":           "API rate limit exceeded for user ID 1.",
			"documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-primary-rate-limits"})
	default:
		json.NewEncoder(w).Encode(map[string]any{"login": "octocat", "id": 1})
	}
}

// answered returns the refusals it answered and the calls it got.
func (g *ghStandIn) answered() (refusals []string, calls int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.refusals...), g.calls
}

// openAIStandIn is an OpenAI-like upstream: POST /v1/chat/completions
// under a requests limit and a tokens limit per window (each call spends
// the tokens its body's max_completion_tokens asks for), with OpenAI's
// six fields and its error body.
type openAIStandIn struct {
	secret string

	mu       sync.Mutex
	requests windowCount
	tokens   windowCount
	refusals []string
	calls    int
}

func newOpenAIStandIn(secret string, requests, tokens int, window time.Duration) *openAIStandIn {
	return &openAIStandIn{secret: secret, requests: windowCount{quota: requests, window: window},
		tokens: windowCount{quota: tokens, window: window}}
}

func (o *openAIStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+o.secret {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var req struct {
		MaxTokens int `json:"max_completion_tokens"`
	}
	json.NewDecoder(r.Body).Decode(&req)
	cost := max(req.MaxTokens, 1)
	now := time.Now()
	o.mu.Lock()
	o.calls++
	// A call is refused whole: the requests window is rolled first, the
	// tokens one only spent when both allow it.
	okR := o.requests.take(now, 0) && o.requests.used < o.requests.quota
	okT := o.tokens.take(now, 0) && o.tokens.used+cost <= o.tokens.quota
	if okR && okT {
		o.requests.used++
		o.tokens.used += cost
	} else {
		o.refusals = append(o.refusals, fmt.Sprintf("requests=%v tokens=%v", okR, okT))
	}
	until := func(c windowCount) string {
		return c.start.Add(c.window).Sub(now).Round(time.Millisecond).String()
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Ratelimit-Limit-Requests", strconv.Itoa(o.requests.quota))
	h.Set("X-Ratelimit-Remaining-Requests", strconv.Itoa(o.requests.quota-o.requests.used))
	h.Set("X-Ratelimit-Reset-Requests", until(o.requests))
	h.Set("X-Ratelimit-Limit-Tokens", strconv.Itoa(o.tokens.quota))
	h.Set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(o.tokens.quota-o.tokens.used))
	h.Set("X-Ratelimit-Reset-Tokens", until(o.tokens))
	o.mu.Unlock()
	if !okR || !okT {
		kind := "requests"
		if okR {
			kind = "tokens"
		}
		w.WriteHeader(http.StatusTooManyRequests)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
			"message": "Rate limit reached for " + kind, "type": kind, "param": nil, "code": "rate_limit_exceeded"}})
		return
	}
	json.NewEncoder(w).Encode(map[string]any{"id": "chatcmpl-1", "object": "chat.completion", "created": now.Unix(), "model": "gpt-test",
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": "ok"}}},
		"usage":   map[string]any{"prompt_tokens": 0, "completion_tokens": cost, "total_tokens": cost}})
}

// answered returns the refusals it answered and the calls it got.
func (o *openAIStandIn) answered() (refusals []string, calls int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.refusals...), o.calls
}

// A try is one attempt on a key as mcp-quota's activity has it: when it
// was admitted or refused, and when its caller asked (before any wait).
type try struct {
	caller    string
	at, asked time.Time
	admitted  bool
}

// tries returns the attempts on key, oldest first, from mcp-quota's own
// activity: the times its promises are made on.
func (s *stack) tries(t testing.TB, key string) []try {
	t.Helper()
	var out []try
	if err := s.DB.View(t.Context(), func(tx ledger.ReadTx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Key: key, Limit: 10_000})
		for _, a := range list {
			out = append(out, try{caller: a.Caller, at: a.At, asked: a.At.Add(-a.Wait), admitted: a.State != ledger.RejectedLocal})
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(out, func(a, b try) int { return a.at.Compare(b.at) })
	return out
}

// spent is how a key's budget of quota calls per window was spent, judged
// on mcp-quota's own log of attempts rather than on the upstream's
// window edges, so that it holds however the calls were spaced, however
// slowly the callers came, and whatever delay the calls met on their way
// to the upstream.
type spent struct {
	quota  int
	window time.Duration
	// comeBack bounds how long a slot stays free once it came free (a
	// window after the admission that took it) and a caller asked for it
	// (a call held, refused and not yet back, or asked for after):
	// the second the upstream's reset is rounded to (it holds until the
	// end of that second), the SDK's own wait past the reset it read, and
	// half a window for the caller to come back with its next call.
	comeBack time.Duration
}

// check reports a rolling window of admissions holding more than the
// quota (when rolling is set: the key's documented policy, a promise made
// on mcp-quota's clock) and a slot not taken again within comeBack of
// being free and asked for, among the slots due again before end (when
// the callers stopped looping); no slot to judge is an error too.
func (sp spent) check(t *testing.T, tries []try, end time.Time, rolling bool) {
	t.Helper()
	var at []time.Time
	for _, tr := range tries {
		if tr.admitted {
			at = append(at, tr.at)
		}
	}
	if got := (demo.Stats{Accepted: at}).MaxInWindow(sp.window); rolling && got > sp.quota {
		t.Errorf("mcp-quota admitted %d calls within one %v, more than the quota of %d", got, sp.window, sp.quota)
	}
	// A caller waits on mcp-quota while an attempt is held (from its ask
	// to its admission or refusal) and, once refused, until it asks
	// again: mcp-quota told it when to.
	type span struct{ from, to time.Time }
	var waiting []span
	last := map[string]int{} // each caller's latest attempt so far
	for j, tr := range tries {
		waiting = append(waiting, span{tr.asked, tr.at})
		if k, ok := last[tr.caller]; ok && !tries[k].admitted {
			waiting = append(waiting, span{tries[k].at, tr.asked})
		}
		last[tr.caller] = j
	}
	for _, k := range last {
		if !tries[k].admitted {
			waiting = append(waiting, span{tries[k].at, end})
		}
	}
	// demandFrom is the first moment from x on that a caller waits on
	// mcp-quota or asks; ok is false when none does.
	demandFrom := func(x time.Time) (d time.Time, ok bool) {
		for _, w := range waiting {
			if !w.to.Before(x) && (!ok || w.from.Before(d)) {
				d, ok = w.from, true
			}
		}
		if ok && d.Before(x) {
			d = x
		}
		return d, ok
	}
	judged := 0
	var longest time.Duration
	for i := range at {
		free := at[i].Add(sp.window)
		demand, ok := demandFrom(free)
		if !ok {
			break // nobody asked after it came free
		}
		due := demand.Add(sp.comeBack) // the latest the slot may be taken again
		if due.After(end) {
			break
		}
		judged++
		if i+sp.quota < len(at) {
			longest = max(longest, at[i+sp.quota].Sub(demand))
		}
		if i+sp.quota >= len(at) || at[i+sp.quota].After(due) {
			next := "never"
			if i+sp.quota < len(at) {
				next = at[i+sp.quota].Sub(demand).Round(time.Millisecond).String() + " after"
			}
			t.Errorf("admission %d of %d: its slot, free and asked for %v after it, was taken again %s, want within %v: the budget idled",
				i, len(at), demand.Sub(at[i]).Round(time.Millisecond), next, sp.comeBack)
		}
	}
	if judged == 0 {
		t.Errorf("no slot came free and was asked for while the callers looped: nothing to judge")
		for i, a := range at {
			t.Logf("admission %d: %v before the callers stopped", i, end.Sub(a).Round(time.Millisecond))
		}
	}
	t.Logf("%d admissions; %d slots judged, the longest from free and asked for to taken again: %v (at most %v)",
		len(at), judged, longest.Round(time.Millisecond), sp.comeBack)
}

// windowsIn is how many windows a loop of d touches.
func windowsIn(d, window time.Duration) int {
	return int((d + window - 1) / window)
}
