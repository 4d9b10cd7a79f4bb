package rest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// windowCount is a fixed window that starts with the first call after
// the previous one ended, as GitHub's and OpenAI's do, and what was spent
// in each.
type windowCount struct {
	quota  int
	window time.Duration
	start  time.Time
	used   int
	full   []int       // what each ended window spent
	ends   []time.Time // when each of them ended
}

// spentBy returns what each window that ended by t spent: a window still
// open when the callers stopped (a late retry closes it) was not looped
// through whole.
func spentBy(full []int, ends []time.Time, t time.Time) []int {
	var out []int
	for i, n := range full {
		if !ends[i].After(t) {
			out = append(out, n)
		}
	}
	return out
}

// take spends one at now; ok is false when the window is spent.
func (c *windowCount) take(now time.Time, n int) (ok bool) {
	if c.start.IsZero() || !now.Before(c.start.Add(c.window)) {
		if !c.start.IsZero() {
			c.full = append(c.full, c.used)
			c.ends = append(c.ends, c.start.Add(c.window))
		}
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

// windows returns what each ended window spent, and the refusals.
// windows returns what each primary window that ended by t spent, the
// refusals and the calls.
func (g *ghStandIn) windows(t time.Time) (full []int, refusals []string, calls int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return spentBy(g.primary.full, g.primary.ends, t), append([]string(nil), g.refusals...), g.calls
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

// windows returns what each window that ended by t spent, in requests
// and in tokens, the refusals and the calls.
func (o *openAIStandIn) windows(t time.Time) (requests, tokens []int, refusals []string, calls int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return spentBy(o.requests.full, o.requests.ends, t), spentBy(o.tokens.full, o.tokens.ends, t), append([]string(nil), o.refusals...), o.calls
}
