package pacer_test

import (
	"cmp"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// simPolicy is one limit the simulated upstream enforces: a sliding window,
// or fixed windows that start with the first call after the previous one
// ended, or (aligned) at whole multiples of w.
type simPolicy struct {
	name    string
	q       int
	w       time.Duration
	sliding bool
	aligned bool
	shown   bool // shown in RateLimit when it is the closest to exhaustion
	listed  bool // listed in RateLimit-Policy

	start time.Time   // fixed: the current window's start
	n     int         // fixed: calls in it
	log   []time.Time // sliding: calls in the window
}

// used returns the calls the policy counts at now, and when one more
// becomes possible.
func (p *simPolicy) used(now time.Time) (int, time.Time) {
	if p.sliding {
		for len(p.log) > 0 && !p.log[0].After(now.Add(-p.w)) {
			p.log = p.log[1:]
		}
		if len(p.log) == 0 {
			return 0, now
		}
		return len(p.log), p.log[0].Add(p.w)
	}
	if p.start.IsZero() || !now.Before(p.start.Add(p.w)) {
		return 0, now
	}
	return p.n, p.start.Add(p.w)
}

func (p *simPolicy) count(now time.Time) {
	if p.sliding {
		p.log = append(p.log, now)
		return
	}
	if p.start.IsZero() || !now.Before(p.start.Add(p.w)) {
		p.start, p.n = now, 0
		if p.aligned {
			p.start = now.Truncate(p.w)
		}
	}
	p.n++
}

// simUpstream is an API enforcing its policies, announcing them as they
// say, answering a refusal with 429 (and Retry-After in whole seconds,
// when retryAfter).
type simUpstream struct {
	policies   []*simPolicy
	retryAfter bool
	accepted   []time.Time
	refused    int
}

func (u *simUpstream) serve(now time.Time) (int, *ratelimit.Reading) {
	allowed := true
	var free time.Time
	for _, p := range u.policies {
		if n, at := p.used(now); n >= p.q {
			allowed = false
			free = maxTime(free, at)
		}
	}
	if allowed {
		for _, p := range u.policies {
			p.count(now)
		}
		u.accepted = append(u.accepted, now)
	} else {
		u.refused++
	}
	rd := &ratelimit.Reading{}
	var closest *simPolicy
	for _, p := range u.policies {
		n, _ := p.used(now)
		if p.shown && (closest == nil || float64(p.q-n)/float64(p.q) < float64(closest.q-mustUsed(closest, now))/float64(closest.q)) {
			closest = p
		}
	}
	for _, p := range u.policies {
		n, at := p.used(now)
		switch {
		case p == closest:
			rd.Observations = append(rd.Observations, shown(p.name, int64(p.q), p.w, int64(p.q-n), ceilSeconds(at.Sub(now))))
		case p.listed:
			rd.Observations = append(rd.Observations, listed(p.name, int64(p.q), p.w))
		}
	}
	if allowed {
		return 200, rd
	}
	if u.retryAfter {
		rd.RetryAfter, rd.HasRetryAfter = max(ceilSeconds(free.Sub(now)), time.Second), true
	}
	rd.Throttled = true
	return 429, rd
}

func mustUsed(p *simPolicy, now time.Time) int { n, _ := p.used(now); return n }

func ceilSeconds(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(d.Seconds())) * time.Second
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestHiddenLimitCostsOneRefusal runs an agent and a sync job (two
// processes on one state file) against an upstream with a generous minute
// limit it shows and a tight hourly one, for two hours: announced only
// in RateLimit-Policy, the hourly limit costs no refusal; announced
// nowhere, it costs one, the refusal that reveals it. Either way at least
// 95% of what the upstream allows is used. Refusals without Retry-After
// do not say how long the window is: each doubles the guess, and the
// guess may end up to twice too long.
func TestHiddenLimitCostsOneRefusal(t *testing.T) {
	const (
		minuteQ = 20
		hourQ   = 60
		hours   = 2
	)
	tests := []struct {
		name         string
		listed       bool // the hourly limit is in RateLimit-Policy
		sliding      bool
		noRA         bool // refusals carry no Retry-After
		aligned      bool // fixed windows on the clock's hours…
		before       int  // …after this many calls spread over the half hour before the run
		wantRefusals int
		wantUse      float64 // of what the upstream allowed; 0 means 95%
	}{
		{name: "listed, fixed windows", listed: true, wantRefusals: 0},
		{name: "listed, sliding windows", listed: true, sliding: true, wantRefusals: 0},
		{name: "hidden, fixed windows", wantRefusals: 1},
		{name: "hidden, sliding windows", sliding: true, wantRefusals: 1},
		// 60 calls take 3.5 minutes at the minute limit; the guesses of
		// the window double from there: 7, 13, 25, 50 and 99 minutes.
		{name: "hidden, no retry-after", sliding: true, noRA: true, wantRefusals: 6, wantUse: 0.5},
		// Calls late in one hour, then a burst at the start of the next: the
		// first refusal cannot tell where the window began; the second,
		// after its Retry-After, can.
		{name: "hidden, clock-aligned windows after earlier calls", aligned: true, before: 55, wantRefusals: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			_, other := e.open()
			k := newKey()
			k.MaxRate, k.LowWater = 10, 0.1
			up := &simUpstream{retryAfter: !tt.noRA, policies: []*simPolicy{
				{name: "minute", q: minuteQ, w: time.Minute, sliding: tt.sliding, aligned: tt.aligned, shown: true, listed: true},
				{name: "hour", q: hourQ, w: time.Hour, sliding: tt.sliding, aligned: tt.aligned, shown: tt.listed, listed: tt.listed},
			}}
			if tt.before > 0 {
				e.clk.advance(-30 * time.Minute)
				for range tt.before {
					tk, err := e.p.Admit(context.Background(), e.call(k, "sync", "/items"))
					var pe *pacer.PauseError
					var waited time.Duration
					if errors.As(err, &pe) { // at most a probe's jitter
						waited = pe.RetryAfter
						e.clk.advance(waited)
						tk, err = e.p.Admit(context.Background(), e.call(k, "sync", "/items"))
					}
					if err != nil {
						t.Fatal(err)
					}
					status, rd := up.serve(e.clk.Now())
					answerWith(t, e.p, e.clk, tk, status, rd)
					e.clk.advance(30*time.Minute/time.Duration(tt.before) - waited)
				}
				up.accepted = nil
			}
			end := start.Add(hours * time.Hour)
			var warnings []reason.Reason
			for i := 0; e.clk.Now().Before(end); i++ {
				p, caller := e.p, "agent"
				if i%2 == 1 {
					p, caller = other, "sync"
				}
				tk, err := p.Admit(context.Background(), e.call(k, caller, "/items"))
				var pe *pacer.PauseError
				if errors.As(err, &pe) {
					e.clk.advance(pe.RetryAfter)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				e.clk.advance(20 * time.Millisecond) // the upstream takes a while
				status, rd := up.serve(e.clk.Now())
				res := answerWith(t, p, e.clk, tk, status, rd)
				warnings = append(warnings, res.Warnings...)
			}
			if up.refused != tt.wantRefusals {
				t.Errorf("got %d refusals, want %d; warnings: %q", up.refused, tt.wantRefusals, warnings)
			}
			allowed, use := hours*hourQ, cmp.Or(tt.wantUse, 0.95)
			if got := len(up.accepted); float64(got) < use*float64(allowed) {
				t.Errorf("got %d calls accepted in %d hours, want at least %.0f%% of the %d allowed", got, hours, 100*use, allowed)
			}
			if got := testkit.MostIn(up.accepted, time.Hour); tt.sliding && got > hourQ {
				t.Errorf("the simulated upstream accepted %d calls in an hour: the simulation is broken", got)
			}
			var hiddenWarnings []string
			for _, w := range warnings {
				if strings.Contains(w.String(), "never announced") {
					hiddenWarnings = append(hiddenWarnings, w.String())
				}
			}
			if tt.wantRefusals > 0 && (len(hiddenWarnings) != tt.wantRefusals || !strings.Contains(hiddenWarnings[len(hiddenWarnings)-1], "60 calls per")) {
				t.Errorf("got warnings %q, want %d about the hidden limit, the last saying it is 60 calls", warnings, tt.wantRefusals)
			}
			if tt.wantRefusals > 0 && !tt.noRA {
				b := upstreamBudget(t, e.status(k, "agent"), "hidden")
				// Up to 2 s of rounding and latency; with clock-aligned windows,
				// counted from the first call after the hour.
				least := time.Hour
				if tt.aligned {
					least = 59 * time.Minute
				}
				if b.Limit != hourQ || b.Window < least || b.Window > time.Hour+2*time.Second {
					t.Errorf("status: got %d per %v, want %d per an hour", b.Limit, b.Window, hourQ)
				}
			}
		})
	}
}

// A refusal nothing explains is recorded as a hidden limit, shown in the
// status and enforced; the refusals of calls already in flight when it
// was discovered are part of the same discovery.
func TestHiddenLimitIsRecordedAndShown(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	for range 10 {
		e.send(k, "sync", 200, reading(0, shown("minute", 100, time.Minute, 90, 50*time.Second)))
		e.clk.advance(time.Second)
	}
	late1 := e.mustAdmit(k, "sync", "/items")
	e.clk.advance(100 * time.Millisecond)
	late2 := e.mustAdmit(k, "agent", "/items")
	refusal := reading(50*time.Second, shown("minute", 100, time.Minute, 89, 50*time.Second))
	refusal.Throttled = true
	res := e.answer(late1, 429, refusal)
	// The window: from the first call to the end of Retry-After.
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "never announced ('hidden')") ||
		!strings.Contains(res.Warnings[0].String(), "10 calls per 61 s") {
		t.Errorf("first refusal: got warnings %q, want a hidden limit of 10 calls per 61 s", res.Warnings)
	}
	if res.State != "rejected_upstream" {
		t.Errorf("first refusal: got state %q, want rejected_upstream", res.State)
	}
	if res := e.answer(late2, 429, refusal); len(res.Warnings) != 0 {
		t.Errorf("a call in flight during the discovery: got warnings %q, want none", res.Warnings)
	}

	st := e.status(k, "agent")
	b := upstreamBudget(t, st, "hidden")
	if !b.Hidden || b.Limit != 10 || b.Window != 60100*time.Millisecond || !b.Counted || b.Remaining != 0 || b.Used != 12 {
		t.Errorf("status: got %+v, want hidden, 10 per 60.1 s, counted locally: 12 used, none left", b)
	}
	if len(st.Warnings) != 1 || st.Warnings[0].Kind != "hidden-limit" {
		t.Errorf("status warnings: got %+v, want the hidden limit", st.Warnings)
	}
	// Enforced: after Retry-After, nothing until the first of the ten
	// leaves the minute (each refused call stays counted).
	e.clk.advance(51 * time.Second)
	if pe := e.mustPause(k, "agent", "/items"); pe.Source != "hidden" {
		t.Errorf("after Retry-After: got %s, want the hidden limit", pe.Source)
	}
}

// A refusal naming a policy in its problem's violated-policies: an
// unknown name is the hidden limit's name; a known one explains the
// refusal.
func TestViolatedPolicies(t *testing.T) {
	refused := func(names ...string) *ratelimit.Reading {
		rd := reading(10*time.Second, shown("minute", 100, time.Minute, 50, 30*time.Second))
		rd.Throttled, rd.Problem = true, &ratelimit.Problem{Status: 429, ViolatedPolicies: names}
		return rd
	}
	t.Run("unknown", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		e.send(k, "agent", 200, nil)
		e.clk.advance(time.Second)
		res := e.send(k, "agent", 429, refused("daily"))
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "('daily')") {
			t.Errorf("got warnings %q, want the hidden limit named 'daily'", res.Warnings)
		}
		if b := upstreamBudget(t, e.status(k, "agent"), "daily"); !b.Hidden || b.Limit != 1 {
			t.Errorf("got %+v, want 'daily' hidden with a limit of 1", b)
		}
	})
	t.Run("known", func(t *testing.T) {
		e := newEnv(t)
		k := newKey(policy("burst", 100, time.Second))
		e.send(k, "agent", 200, nil)
		e.clk.advance(time.Second)
		if res := e.send(k, "agent", 429, refused("minute", "burst")); len(res.Warnings) != 0 {
			t.Errorf("got warnings %q, want none: the policies are known", res.Warnings)
		}
	})
}

// A limit revealed before anything was accepted is recorded without a
// quota: Retry-After and backoff pace the key.
func TestHiddenLimitWithNothingAccepted(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	rd := reading(30 * time.Second)
	rd.Throttled = true
	res := e.send(k, "agent", 429, rd)
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "before any call of it was accepted") {
		t.Errorf("got warnings %q", res.Warnings)
	}
	b := upstreamBudget(t, e.status(k, "agent"), "hidden")
	if b.Limit != 0 || b.Remaining != -1 {
		t.Errorf("got %+v, want a hidden policy with no known quota", b)
	}
}
