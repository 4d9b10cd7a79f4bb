package pacer_test

import (
	"slices"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A send stays in the log's window for its latency too: the upstream
// counts it from when it received it, at the latest when it answered. A
// send still unanswered stays for as long as it is in flight. Either way
// no longer than a twentieth of the window.
func TestSendsStayForTheirLatency(t *testing.T) {
	const w = 10 * time.Second
	tests := []struct {
		name    string
		latency time.Duration // -1: never answered
		want    time.Duration // the wait when the send is w old
	}{
		{name: "answered at once", latency: 0, want: 0},
		{name: "answered after 30 ms", latency: 30 * time.Millisecond, want: 30 * time.Millisecond},
		{name: "answered after 2 s", latency: 2 * time.Second, want: w / 20},
		{name: "in flight", latency: -1, want: w / 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			k := newKey(policy("default", 1, w))
			tk := e.mustAdmit(k, "agent", "/items")
			if tt.latency >= 0 {
				e.clk.advance(tt.latency)
				e.answer(tk, 200, nil)
				e.clk.advance(-tt.latency)
			}
			e.clk.advance(w)
			if tt.want == 0 {
				e.mustAdmit(k, "agent", "/items")
				return
			}
			// What a caller is told agrees: the window frees its slot then.
			if st := e.status(k, "agent"); len(st.Local) != 1 || st.Local[0].Remaining != 0 || st.Local[0].Reset != tt.want {
				t.Errorf("when the send is %v old: the status's local budgets are %+v, want 'default' with none left for %v", w, st.Local, tt.want)
			}
			if pe := e.mustPause(k, "agent", "/items"); pe.RetryAfter != tt.want || pe.Source != "default" {
				t.Errorf("when the send is %v old: got %s for %v, want 'default' for %v", w, pe.Source, pe.RetryAfter, tt.want)
			}
			e.clk.advance(tt.want)
			e.mustAdmit(k, "agent", "/items")
		})
	}
}

// An observation of a window that an earlier one already bounded ends
// when the earlier one said: its r fell by exactly the sends made since,
// so it speaks of the same window, and its t, rounded up to the second,
// says less. One whose r did not fall so is another window's.
func TestEarliestEndOfAWindow(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	unnamed := func(r int64, t time.Duration) *ratelimit.Reading {
		return reading(0, shown("default", 0, 0, r, t))
	}
	e.send(k, "agent", 200, unnamed(10, 4*time.Second)) // the window ends at 4 s
	e.clk.advance(900 * time.Millisecond)
	e.send(k, "agent", 200, unnamed(9, 4*time.Second)) // 3.1 s, rounded up
	if b := upstreamBudget(t, e.status(k, "agent"), "default"); b.Reset != 3100*time.Millisecond {
		t.Errorf("the same window: got a reset in %v, want 3.1s (at 4 s)", b.Reset)
	}
	e.clk.advance(100 * time.Millisecond)
	e.send(k, "agent", 200, unnamed(9, 4*time.Second)) // r did not fall: not the same window
	if b := upstreamBudget(t, e.status(k, "agent"), "default"); b.Reset != 4*time.Second {
		t.Errorf("another window: got a reset in %v, want 4s, its own", b.Reset)
	}
}

// When an exhausted observation's r is what the log leaves of the
// policy's quota, the upstream's window holds exactly the log's sends and
// frees when the oldest of them leaves the log, not at the end of a t
// rounded up to the second. The policy is the observation's own when it
// names q and w, else the documented one of the same quota.
func TestExhaustedWindowEndsWithTheLog(t *testing.T) {
	const w = 10 * time.Second
	tests := []struct {
		name string
		k    *keystore.Key
		last ratelimit.Observation
	}{
		{name: "announced q and w", k: newKey(), last: shown("default", 3, w, 0, w)},
		{name: "documented w, vendor fields", k: newKey(policy("default", 3, w)),
			last: ratelimit.Observation{Unit: ratelimit.Requests, Quota: 3, HasQuota: true, Remaining: 0, HasRemaining: true,
				Reset: w, HasReset: true, Shape: ratelimit.ShapeVendor, Profile: ratelimit.GitHub}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.send(tt.k, "agent", 200, nil)
			e.clk.advance(100 * time.Millisecond)
			e.send(tt.k, "agent", 200, nil)
			e.clk.advance(100 * time.Millisecond)
			e.send(tt.k, "agent", 200, reading(0, tt.last)) // t rounded up: it says 10.2 s
			pe := e.mustPause(tt.k, "agent", "/items")
			if want := w - 200*time.Millisecond; pe.RetryAfter != want {
				t.Errorf("got a pause of %v (%s), want %v: until the first send leaves the window", pe.RetryAfter, pe.Reason, want)
			}
		})
	}
}

// The probe after an observation expires is jittered within a share of
// its window (w/40), not a whole second whatever the window.
func TestProbeJitterFollowsTheWindow(t *testing.T) {
	const w = 4 * time.Second
	e := newEnv(t)
	k := newKey()
	var waits []time.Duration
	for range 20 {
		e.send(k, "agent", 200, reading(0, shown("default", 40, w, 0, time.Second)))
		e.clk.advance(time.Second) // expired: one probe, after its jitter
		pe := e.mustPause(k, "agent", "/items")
		if pe.Reason.Kind != reason.ProbeDue {
			t.Fatalf("after expiry: got a pause for %+v, want the probe's jitter", pe.Reason)
		}
		waits = append(waits, pe.RetryAfter)
		e.clk.advance(pe.RetryAfter)
	}
	if longest := slices.Max(waits); longest > w/40 {
		t.Errorf("got probe jitters %v, want them within %v", waits, w/40)
	}
}
