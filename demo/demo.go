// Package demo is a simulated upstream API: the participants API whose
// rate-limit page is the reference contract of mcp-quota (120 calls per minute
// per key, RateLimit-Policy/RateLimit and X-RateLimit-* on every answer,
// 429 with Retry-After and a problem+json body with "code": "rateLimited",
// ETag and If-None-Match → 304 that still counts, pages of up to 500
// participants, updatedSince). It backs `mcp-quota serve --demo`, the
// end-to-end tests and the pacer benchmark.
//
// Besides the reference API's behaviour ([FixedWindow]) it can announce and enforce its
// limit the ways other APIs do ([Mode]): a sliding window, a second,
// tighter long policy that the RateLimit field shows only when it is the
// closest to exhaustion, GitHub's vendor headers with an epoch reset,
// Retry-After only, no signal at all, and generous lies over a real limit.
// With [Config].Servers > 1 the key's requests go round-robin to
// independent servers that each count their own window, as the reference API warns.
//
// Time comes only from [Config].Clock, so tests drive the API with an
// injected clock and never sleep.
//
// # Endpoints
//
// Every request needs "Authorization: Bearer <token>"; each token is its
// own key. A request without an accepted token gets 401 and does not
// count. Every other request counts against the key's limit before it is
// routed — including 304, 400 and 404 answers — unless it is refused for
// the limit, which executes nothing and does not count.
//
//	GET  /v1/participants?limit=N&cursor=C&updatedSince=T
//	GET  /v1/participants/{id}
//	POST /v1/participants
//	GET  /v1/report?bytes=N
//	ANY  /v1/echo
//
// The data set is generated deterministically: Records participants with
// ids p-000001, p-000002, … in that (stable) order, each updatedAt (whole
// seconds, UTC) in the 30 days before 2026-01-01T00:00:00Z.
package demo

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
)

// Mode selects how the demo API announces and enforces its limit. The
// zero value "" means [FixedWindow].
type Mode string

// The modes. Every mode enforces its limit per key (and per server, see
// [Config].Servers); they differ in the window and in what they tell.
const (
	// FixedWindow is the reference API: a fixed window of Quota calls per
	// Window per key; RateLimit-Policy/RateLimit and X-RateLimit-Limit/
	// -Remaining/-Reset (delta seconds) on every answer, including 304 and
	// 429; a refusal is 429 with Retry-After and a problem+json body with
	// "code": "rateLimited". Its name on the command line is "seed".
	FixedWindow Mode = "seed"
	// Sliding is a sliding-window log: no more than Quota accepted calls in
	// any rolling Window. It tells and refuses like FixedWindow; t and Retry-After
	// are the seconds until the oldest counted call leaves the window.
	Sliding Mode = "sliding"
	// HiddenLong enforces two fixed-window policies at once, "minute"
	// (Quota per Window) and the tighter-in-the-long-run "hour" (LongQuota
	// per LongWindow). RateLimit-Policy lists both; RateLimit shows only
	// the one closest to exhaustion (fewest calls left; on a tie, the
	// longer wait); no X-RateLimit-* fields. Refusals as in FixedWindow, for the
	// policy that refused.
	HiddenLong Mode = "hidden"
	// GitHubStyle sends only GitHub's vendor fields X-RateLimit-Limit,
	// -Remaining, -Used, -Reset (Unix epoch seconds of the window's end,
	// rounded up) and -Resource: core. A refusal is [Config].GitHubStatus
	// (403 by default) with X-RateLimit-Remaining: 0, no Retry-After, and a
	// JSON body with GitHub's "message" and "documentation_url".
	GitHubStyle Mode = "github"
	// RetryAfterOnly sends no quota fields; a refusal is 429 with
	// Retry-After and a plain-text body.
	RetryAfterOnly Mode = "retry-after"
	// Silent sends no rate-limit fields at all; a refusal is a bare 429
	// with a plain-text body and no Retry-After.
	Silent Mode = "silent"
	// Liar advertises absurdly generous values on every answer, refusals
	// included — RateLimit-Policy "default";q=1000000;w=1, RateLimit
	// "default";r=1000000;t=1, X-RateLimit-Limit and -Remaining 1000000,
	// -Reset 1 — while it enforces FixedWindow's window and refuses with
	// 429, a truthful Retry-After and the same problem body.
	Liar Mode = "liar"
)

// Modes returns every mode, FixedWindow first.
func Modes() []Mode {
	return []Mode{FixedWindow, Sliding, HiddenLong, GitHubStyle, RetryAfterOnly, Silent, Liar}
}

// ParseMode returns the Mode named s ("" is FixedWindow), or an error naming the
// modes there are.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return FixedWindow, nil
	}
	for _, m := range Modes() {
		if string(m) == s {
			return m, nil
		}
	}
	names := make([]string, 0, len(Modes()))
	for _, m := range Modes() {
		names = append(names, string(m))
	}
	return "", fmt.Errorf("unknown demo mode %q (want one of %s)", s, strings.Join(names, ", "))
}

// Config configures the demo API. Its zero value is the reference API:
// 120 calls per 60 s fixed window per key, one server, 10,000
// participants, any bearer token, the system clock.
type Config struct {
	// Mode says how the limit is announced and enforced; "" means FixedWindow.
	Mode Mode
	// Quota is the calls per Window per key; 0 means 120.
	Quota int
	// Window is the length of the limit's window; 0 means 60s. A fixed
	// window is not aligned to the clock: it starts with the key's first
	// call and ends Window later, and the next one starts with the first
	// call after that. Header fields carry Window, and every other
	// duration, in whole seconds rounded up.
	Window time.Duration
	// LongQuota is the quota of HiddenLong's "hour" policy; 0 means
	// Quota*3/2 (at least Quota+1). With the default LongWindow that
	// policy allows 30% of what "minute" would over the same time, so a
	// client that spends the minute allowance at its full rate is stopped
	// by "hour" first: after one and a half windows. (A client bursting
	// from a standstill meets "minute" first, at call Quota+1, and "hour"
	// in the second window.) Ignored by the other modes.
	LongQuota int
	// LongWindow is the window of HiddenLong's "hour" policy; 0 means
	// 5*Window. Ignored by the other modes.
	LongWindow time.Duration
	// Servers is how many independent servers count the limit. With more
	// than one, each key's requests go round-robin to them, and each keeps
	// its own window (anchored at the first call it serves) and admits its
	// share of the quota (Quota split as evenly as integers allow, the
	// first servers taking the remainder). Together they admit Quota calls
	// per window when the key's traffic starts evenly; once a pause has
	// put their windows out of line, a rolling window can hold more than
	// Quota — the reference API's warning, "Das Zeitfenster wird pro Server
	// gezählt". (Servers never add to the quota itself.) Each server
	// reports the key's remaining calls as it sees them: its own
	// remaining times Servers, at most the quota. 0 or 1 means one server.
	// It may not exceed Quota (nor LongQuota in HiddenLong).
	Servers int
	// Records is the number of participants in the data set; 0 means
	// 10000.
	Records int
	// Tokens are the accepted bearer tokens, each its own key. Nil means
	// any non-empty bearer token is accepted and is its own key; an empty
	// non-nil slice accepts none.
	Tokens []string
	// GitHubStatus is the status of a GitHubStyle refusal: 0 means 403
	// (http.StatusForbidden); 429 is the other status GitHub uses.
	GitHubStatus int
	// Clock is the API's only time; nil means real time.
	Clock clock.Clock
}

// Validate reports whether New accepts c: a known Mode, no negative
// numbers, Servers no more than the quotas, GitHubStatus 0, 403 or 429.
func (c Config) Validate() error {
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	switch {
	case c.Quota < 0:
		return fmt.Errorf("demo quota %d is negative", c.Quota)
	case c.Window < 0:
		return fmt.Errorf("demo window %v is negative", c.Window)
	case c.LongQuota < 0:
		return fmt.Errorf("demo long quota %d is negative", c.LongQuota)
	case c.LongWindow < 0:
		return fmt.Errorf("demo long window %v is negative", c.LongWindow)
	case c.Servers < 0:
		return fmt.Errorf("demo servers %d is negative", c.Servers)
	case c.Records < 0:
		return fmt.Errorf("demo records %d is negative", c.Records)
	}
	switch c.GitHubStatus {
	case 0, http.StatusForbidden, http.StatusTooManyRequests:
	default:
		return fmt.Errorf("demo github status %d is neither 403 nor 429", c.GitHubStatus)
	}
	d := c.withDefaults()
	if d.Servers > d.Quota || (d.Mode == HiddenLong && d.Servers > d.LongQuota) {
		return fmt.Errorf("demo has %d servers for a quota of %d: each server must admit at least one call", d.Servers, min(d.Quota, d.LongQuota))
	}
	return nil
}

// withDefaults returns c with every zero field replaced by its default.
func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = FixedWindow
	}
	if c.Quota == 0 {
		c.Quota = 120
	}
	if c.Window == 0 {
		c.Window = 60 * time.Second
	}
	if c.LongQuota == 0 {
		c.LongQuota = max(c.Quota*3/2, c.Quota+1)
	}
	if c.LongWindow == 0 {
		c.LongWindow = 5 * c.Window
	}
	if c.Servers == 0 {
		c.Servers = 1
	}
	if c.Records == 0 {
		c.Records = 10000
	}
	if c.GitHubStatus == 0 {
		c.GitHubStatus = http.StatusForbidden
	}
	c.Clock = clock.Or(c.Clock)
	return c
}

// API is the demo upstream, an http.Handler. Create it with New; the zero
// value is not usable. It is safe for concurrent use.
type API struct {
	cfg    Config
	tokens map[string]bool // nil: any non-empty token
	data   []participant

	mu      sync.Mutex
	keys    map[string]*key
	created int // participants created by POST, for their ids
}

// New returns the demo API configured by cfg. It panics if cfg is not
// valid (see Config.Validate); call Validate first for configuration that
// comes from a user.
func New(cfg Config) *API {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	a := &API{
		cfg:  cfg,
		data: generate(cfg.Records),
		keys: make(map[string]*key),
	}
	if cfg.Tokens != nil {
		a.tokens = make(map[string]bool, len(cfg.Tokens))
		for _, t := range cfg.Tokens {
			a.tokens[t] = true
		}
	}
	return a
}

// Reset forgets every key's windows and statistics, as if no request had
// arrived yet.
func (a *API) Reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = make(map[string]*key)
	a.created = 0
}

// Stats returns what the API saw for the key token so far; the zero
// Stats for a token it never accepted.
func (a *API) Stats(token string) Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keys[token]
	if !ok {
		return Stats{}
	}
	s := k.stats
	s.Accepted = append([]time.Time(nil), k.stats.Accepted...)
	return s
}

// ServeHTTP authenticates the request, counts it against its key's limit
// and, if the limit admits it, executes it. Rate-limit header fields are
// set as the Mode prescribes on every answer except 401.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, ok := a.authenticate(r)
	if !ok {
		setAuthenticate(w.Header())
		writeProblem(w, http.StatusUnauthorized, "unauthorized",
			"Send an accepted API key as \"Authorization: Bearer <key>\".")
		return
	}
	now, d := a.admit(token)
	setLimitHeaders(w.Header(), a.cfg.Mode, d, now)
	if !d.allowed {
		a.refuse(w, d)
		return
	}
	a.route(w, r, now)
}

// authenticate returns the request's bearer token if it is accepted.
func (a *API) authenticate(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", false
	}
	if a.tokens != nil && !a.tokens[token] {
		return "", false
	}
	return token, true
}

// admit counts one request of token at the API's current time on the
// server its turn falls to, and returns that time and the decision.
func (a *API) admit(token string) (time.Time, decision) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.cfg.Clock.Now()
	k, ok := a.keys[token]
	if !ok {
		k = newKey(a.cfg, len(a.keys)+1)
		a.keys[token] = k
	}
	d := k.admit(now)
	k.stats.Requests++
	if d.allowed {
		k.stats.Accepted = append(k.stats.Accepted, now)
	} else {
		k.stats.Rejected++
	}
	return now, d
}

// refuse answers a request the limit refused, in the Mode's format.
func (a *API) refuse(w http.ResponseWriter, d decision) {
	switch a.cfg.Mode {
	case GitHubStyle:
		writeJSON(w, a.cfg.GitHubStatus, gitHubRefusal{
			Message:          fmt.Sprintf("API rate limit exceeded for user ID %d.", d.keyID),
			DocumentationURL: "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api",
			Status:           fmt.Sprint(a.cfg.GitHubStatus),
		})
	case RetryAfterOnly, Silent:
		writeText(w, http.StatusTooManyRequests, http.StatusText(http.StatusTooManyRequests)+"\n")
	default:
		p := d.policies[d.binding]
		wait := seconds(d.retryAfter)
		writeProblem(w, http.StatusTooManyRequests, "rateLimited", fmt.Sprintf(
			"This key made more than %d calls in %s. Try again in %d %s; the RateLimit header says what is left.",
			p.quota, spell(p.window), wait, plural(wait, "second", "seconds")))
	}
}

// gitHubRefusal is the body of GitHub's primary rate-limit refusal.
type gitHubRefusal struct {
	Message          string `json:"message"`
	DocumentationURL string `json:"documentation_url"`
	Status           string `json:"status"`
}

// spell names a window the way the reference API's problem detail does: "a
// minute", "an hour", "5 minutes", "90 seconds".
func spell(d time.Duration) string {
	switch {
	case d == time.Second:
		return "a second"
	case d == time.Minute:
		return "a minute"
	case d == time.Hour:
		return "an hour"
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%d minutes", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%d seconds", d/time.Second)
	}
	return d.String()
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// seconds returns d in whole seconds, rounded up; 0 for d <= 0.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
