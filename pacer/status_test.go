package pacer_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The advice after an answer is one plain sentence a caller can act on.
func TestAdvice(t *testing.T) {
	tests := []struct {
		name  string
		setup func(e *env) pacer.Result
		want  pacer.Advice
	}{
		{
			name: "nothing known",
			setup: func(e *env) pacer.Result {
				return e.send(newKey(), "agent", 200, nil)
			},
			want: pacer.Advice{Action: pacer.Continue, Why: reason.Reason{Kind: reason.NoLimit}},
		},
		{
			name: "continue",
			setup: func(e *env) pacer.Result {
				return e.send(newKey(), "agent", 200, reading(0, shown("default", 120, time.Minute, 117, 42*time.Second)))
			},
			want: pacer.Advice{Action: pacer.Continue, Why: reason.Reason{Kind: reason.CallsLeft, Left: 117, For: 42 * time.Second}},
		},
		{
			name: "continue, a documented policy never used",
			setup: func(e *env) pacer.Result {
				return e.send(newKey(policy("default", 100, time.Minute), policy("hour", 1000, time.Hour)), "agent", 200, nil)
			},
			want: pacer.Advice{Action: pacer.Continue, Why: reason.Reason{Kind: reason.CallsLeft, Left: 99, For: time.Minute}},
		},
		{
			name: "slow down",
			setup: func(e *env) pacer.Result {
				k := newKey()
				k.LowWater = 0.1
				return e.send(k, "agent", 200, reading(0, shown("default", 120, time.Minute, 12, 40*time.Second)))
			},
			want: pacer.Advice{Action: pacer.SlowDown, Why: reason.Reason{Kind: reason.UpstreamLow, Policy: "default", Unit: ratelimit.Requests, Left: 12, For: 40 * time.Second, Spacing: 3 * time.Second}},
		},
		{
			// An upstream saying much is left for a moment would have calls
			// spread faster than the key's maximum rate: the advice says the
			// pace they go at, that rate.
			name: "slow down, no faster than the key's maximum rate",
			setup: func(e *env) pacer.Result {
				k := newKey()
				k.LowWater, k.MaxRate = 0.1, 50
				return e.send(k, "agent", 200, reading(0, shown("default", 100000000, time.Minute, 5000000, time.Second)))
			},
			want: pacer.Advice{Action: pacer.SlowDown, Why: reason.Reason{Kind: reason.UpstreamLow, Policy: "default", Unit: ratelimit.Requests, Left: 5000000, For: time.Second, Spacing: 20 * time.Millisecond}},
		},
		{
			// The local count binds, its oldest call leaves in a moment: the
			// advice is the spread the pacer applies, not a rush for what
			// is left before that moment.
			name: "slow down, documented policy",
			setup: func(e *env) pacer.Result {
				k := newKey(policy("default", 20, time.Minute))
				k.LowWater = 0.1
				e.send(k, "agent", 200, nil)
				e.clk.advance(56 * time.Second)
				for range 17 {
					e.send(k, "agent", 200, nil)
					e.clk.advance(time.Millisecond)
				}
				e.clk.advance(3 * time.Second) // 2 left: spread 3 s apart
				return e.send(k, "agent", 200, nil)
			},
			want: pacer.Advice{Action: pacer.SlowDown, Why: reason.Reason{Kind: reason.WindowLow, Policy: "default", Left: 1, Limit: 20, Spacing: 3 * time.Second}},
		},
		{
			name: "pause, quota spent",
			setup: func(e *env) pacer.Result {
				return e.send(newKey(), "agent", 200, reading(0, shown("default", 120, time.Minute, 0, 18*time.Second)))
			},
			want: pacer.Advice{Action: pacer.Pause, RetryAfter: 18 * time.Second,
				Why: reason.Reason{Kind: reason.UpstreamSpent, Policy: "default", Unit: ratelimit.Requests, Limit: 120, For: 18 * time.Second}},
		},
		{
			name: "pause, Retry-After",
			setup: func(e *env) pacer.Result {
				return e.send(newKey(), "agent", 503, reading(18*time.Second))
			},
			want: pacer.Advice{Action: pacer.Pause, RetryAfter: 18*time.Second + 900*time.Millisecond,
				Why: reason.Reason{Kind: reason.RetryAfterAsked, Status: 503, For: 18 * time.Second}}, // the gate read back as data
		},
		{
			name: "pause, documented policy spent",
			setup: func(e *env) pacer.Result {
				k := newKey(policy("default", 1, time.Minute))
				return e.send(k, "agent", 200, nil)
			},
			want: pacer.Advice{Action: pacer.Pause, RetryAfter: time.Minute,
				Why: reason.Reason{Kind: reason.WindowSpent, Policy: "default", Limit: 1, Window: time.Minute}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.p = pacer.New(e.rerun, pacer.WithClock(e.clk), pacer.WithJitter(func() float64 { return 0.9 }))
			got := tt.setup(e).Advice
			if diff := cmp.Diff(got, tt.want); diff != "" {
				t.Errorf("advice (-got +want):\n%s", diff)
			}
		})
	}
}

// Status shows every policy: the documented ones counted over every
// caller, and the upstream's, completed from the local log when their r
// is unknown or expired.
func TestStatus(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("default", 120, time.Minute))
	e.send(k, "sync", 200, reading(0,
		shown("minute", 100, time.Minute, 90, 30*time.Second), listed("hour", 1000, time.Hour)))
	e.clk.advance(10 * time.Second)
	e.send(k, "agent", 200, reading(0, shown("minute", 100, time.Minute, 88, 20*time.Second)))
	e.clk.advance(5 * time.Second)
	tk := e.mustAdmit(k, "agent", "/items") // in flight

	st := e.status(k, "agent")
	if st.InFlight != 1 {
		t.Errorf("in flight: got %d, want 1", st.InFlight)
	}
	wantLocal := []pacer.Budget{{Policy: "default", Unit: ratelimit.Requests, Limit: 120, Used: 3, Remaining: 117,
		Reset: 45 * time.Second, Window: time.Minute, Source: "local"}}
	if diff := cmp.Diff(st.Local, wantLocal); diff != "" {
		t.Errorf("local (-got +want):\n%s", diff)
	}
	wantUpstream := []pacer.Budget{
		{Policy: "hour", Unit: ratelimit.Requests, Limit: 1000, Used: 3, Remaining: 997, Reset: time.Hour - 15*time.Second,
			Window: time.Hour, Source: "draft-11", Observed: start, Counted: true},
		{Policy: "minute", Unit: ratelimit.Requests, Limit: 100, Remaining: 87, Reset: 15 * time.Second,
			Window: time.Minute, Source: "draft-11", Observed: start.Add(10 * time.Second)},
	}
	if diff := cmp.Diff(st.Upstream, wantUpstream); diff != "" {
		t.Errorf("upstream (-got +want):\n%s", diff)
	}
	if st.Binding == nil || st.Binding.Policy != "minute" {
		t.Errorf("binding: got %+v, want 'minute'", st.Binding)
	}

	// Once the minute's r expires, the log fills it in.
	e.answer(tk, 200, nil)
	e.clk.advance(30 * time.Second)
	b := upstreamBudget(t, e.status(k, "agent"), "minute")
	if !b.Expired || !b.Counted || b.Remaining != 97 || b.Used != 3 || b.Reset != 15*time.Second {
		t.Errorf("expired minute: got %+v, want expired, counted: 3 calls in the last minute, 97 left, the first leaving in 15s", b)
	}
}
