package pacer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// drive makes one caller call k as fast as it is let through, until the
// clock reaches end, against up: each call reaches the upstream lat(i)
// after its admission (i counts the calls sent) and is answered 200 µs
// later. A pause is waited out on the clock. It returns the warnings the
// answers raised.
func drive(t *testing.T, e *env, k *keystore.Key, up *simUpstream, end time.Time, lat func(i int) time.Duration) []reason.Reason {
	t.Helper()
	var warnings []reason.Reason
	for i := 0; e.clk.Now().Before(end); {
		tk, err := e.p.Admit(context.Background(), e.call(k, "agent", "/items"))
		var pe *pacer.PauseError
		if errors.As(err, &pe) {
			e.clk.advance(max(pe.RetryAfter, time.Microsecond))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		e.clk.advance(lat(i))
		i++
		status, rd := up.serve(e.clk.Now())
		e.clk.advance(200 * time.Microsecond)
		warnings = append(warnings, answerWith(t, e.p, e.clk, tk, status, rd).Warnings...)
	}
	return warnings
}

// windowCounts returns how many of times fall in each of the fixed
// windows of w that open with the first time after the previous one
// ended.
func windowCounts(times []time.Time, w time.Duration) []int {
	var out []int
	var open time.Time
	for _, t := range times {
		if open.IsZero() || !t.Before(open.Add(w)) {
			open = t
			out = append(out, 0)
		}
		out[len(out)-1]++
	}
	return out
}

// A greedy caller against an upstream that enforces the documented limit
// on the times it receives calls, for ten windows (four under -short, two
// with a slow first call): no call is refused,
// however late a window's first call reached the upstream, and nearly
// every call the upstream allows is made. The first call of every other
// window takes 3 ms to arrive, the others 0.1 ms, so a call sent the
// moment the log frees the slow one's slot would arrive before the
// upstream frees it, unless the log keeps each send for its latency too.
func TestWindowEdges(t *testing.T) {
	const (
		q = 40
		w = 4 * time.Second
	)
	windows := 10
	if testing.Short() {
		windows = 4
	}
	slowFirst := func(i int) time.Duration {
		if i%(2*q) == 0 {
			return 3 * time.Millisecond
		}
		return 100 * time.Microsecond
	}
	tests := []struct {
		name       string
		sliding    bool
		shown      bool // RateLimit and RateLimit-Policy on every answer
		retryAfter bool
		fullEach   bool // every fixed window holds the whole quota
		wantUse    float64
	}{
		{name: "retry-after only, fixed windows", retryAfter: true, fullEach: true, wantUse: 0.99},
		{name: "retry-after only, sliding window", sliding: true, retryAfter: true, wantUse: 0.99},
		{name: "no signal, fixed windows", fullEach: true, wantUse: 0.99},
		{name: "no signal, sliding window", sliding: true, wantUse: 0.99},
		// r and t in whole seconds, rounded up: the tail of each window is
		// spread and its end found within a probe's jitter.
		{name: "shown, fixed windows", shown: true, retryAfter: true, fullEach: true, wantUse: 0.97},
		{name: "shown, sliding window", sliding: true, shown: true, retryAfter: true, wantUse: 0.97},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			k := newKey(policy("default", q, w))
			k.LowWater = 0.1
			up := &simUpstream{retryAfter: tt.retryAfter, policies: []*simPolicy{
				{name: "default", q: q, w: w, sliding: tt.sliding, shown: tt.shown, listed: tt.shown},
			}}
			warnings := drive(t, e, k, up, start.Add(time.Duration(windows)*w), slowFirst)
			if up.refused != 0 {
				t.Errorf("got %d refusals, want none; warnings: %q", up.refused, warnings)
			}
			allowed := windows * q
			if got := len(up.accepted); float64(got) < tt.wantUse*float64(allowed) {
				t.Errorf("got %d calls accepted in %d windows, want at least %.0f%% of the %d allowed", got, windows, 100*tt.wantUse, allowed)
			}
			if tt.fullEach {
				counts := windowCounts(up.accepted, w)
				for i, n := range counts[:len(counts)-1] {
					if n != q {
						t.Errorf("window %d of %v: got %d calls, want %d", i+1, counts, n, q)
						break
					}
				}
			}
			if most := testkit.MostIn(up.accepted, w); most > q {
				t.Errorf("the upstream accepted %d calls in %v: the documented policy allows %d", most, w, q)
			}
		})
	}
}

// A refusal of a call admitted as a documented policy's window freed a
// slot, when the sends of that window took longer to reach the upstream
// than the log's margin allows for (here, longer than its bound, w/20), is
// that policy's timing, not a hidden limit: only the Retry-After gate is
// set. A second one within two windows is no race, and reveals a limit.
func TestRefusalAtAWindowEdge(t *testing.T) {
	const w = 10 * time.Second
	e := newEnv(t)
	k := newKey(policy("default", 2, w))
	// Two calls the upstream counts (and answers) 2 s after their
	// admission.
	c1 := e.mustAdmit(k, "agent", "/items")
	e.clk.advance(time.Millisecond)
	c2 := e.mustAdmit(k, "agent", "/items")
	e.clk.advance(2*time.Second - time.Millisecond)
	e.answer(c1, 200, nil)
	e.clk.advance(time.Millisecond)
	e.answer(c2, 200, nil)

	pe := e.mustPause(k, "agent", "/items")
	if want := w + w/20 - 2*time.Second - time.Millisecond; pe.RetryAfter != want {
		t.Fatalf("a full window: got a pause of %v, want %v (until its first send leaves, with the margin's bound)", pe.RetryAfter, want)
	}
	e.clk.advance(pe.RetryAfter)
	// At 10.5 s the upstream still counts both (until 12 s): 429, come back
	// in 2 s.
	res := e.send(k, "agent", 429, refusedFor(2*time.Second))
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "policy 'default' (2 calls per 10 s) freed a slot") {
		t.Errorf("the refusal: got warnings %q, want one about the edge of policy 'default'", res.Warnings)
	}
	st := e.status(k, "agent")
	for _, b := range st.Upstream {
		if b.Hidden {
			t.Errorf("status: got the hidden limit %+v, want none", b)
		}
	}
	if len(st.Gates) != 1 || st.Gates[0].Source != "retry-after" {
		t.Errorf("status: got gates %+v, want the Retry-After gate alone", st.Gates)
	}

	// After it: a call counted 2 s late again, a quick one, and at the
	// next edge a second refusal.
	e.clk.advance(res.RetryIn)
	c4 := e.mustAdmit(k, "agent", "/items")
	e.clk.advance(2 * time.Second)
	e.answer(c4, 200, nil)
	for _, status := range []int{200, 429} {
		pe := e.mustPause(k, "agent", "/items")
		e.clk.advance(pe.RetryAfter)
		if status == 200 {
			e.send(k, "agent", 200, nil)
			continue
		}
		res = e.send(k, "agent", 429, refusedFor(2*time.Second))
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "never announced") {
		t.Errorf("a second refusal at an edge: got warnings %q, want a hidden limit", res.Warnings)
	}
}

// A refusal long after every send that could explain it was answered is
// no race at a window's edge: the upstream had let those sends go.
func TestRefusalAfterTheEdgeRevealsALimit(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("default", 2, 10*time.Second))
	e.send(k, "agent", 200, nil)
	e.clk.advance(time.Millisecond)
	e.send(k, "agent", 200, nil)
	pe := e.mustPause(k, "agent", "/items")
	e.clk.advance(pe.RetryAfter)
	res := e.send(k, "agent", 429, refusedFor(2*time.Second))
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "never announced") {
		t.Errorf("got warnings %q, want a hidden limit", res.Warnings)
	}
}

// refusedFor is a 429's reading with Retry-After ra and nothing else.
func refusedFor(ra time.Duration) *ratelimit.Reading {
	rd := reading(ra)
	rd.Throttled = true
	return rd
}
