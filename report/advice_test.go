package report

import (
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

func TestPaused(t *testing.T) {
	pe := &pacer.PauseError{Key: "demo", RetryAfter: 2300 * time.Millisecond,
		Reason: reason.Reason{Kind: reason.WindowSpent, Policy: "default", Limit: 120, Window: time.Minute}}
	a := Paused("demo", pe, time.Minute)
	want := "Paused: key 'demo': all 120 calls per 60 s allowed by policy 'default' are used; nothing was sent. " +
		"Call again after 3 s, or call again now with max_wait_s: 3 and the call waits for its turn itself."
	if a.Action != "pause" || a.RetryAfterS != 3 || a.Reason != want {
		t.Errorf("Paused = %+v, want pause 3 %q", a, want)
	}
	pe.RetryAfter = 4*time.Minute + 5*time.Second
	a = Paused("demo", pe, time.Minute)
	if a.RetryAfterS != 245 || !strings.Contains(a.Reason, "Call again after 5 min; max_wait_s cannot wait that long (60 s at most)") {
		t.Errorf("Paused beyond max_wait_s = %+v", a)
	}
	pe.RetryAfter = 300 * time.Millisecond // a wait under a second still pauses a whole second
	if a = Paused("demo", pe, time.Minute); a.RetryAfterS != 1 || !strings.Contains(a.Reason, "after 1 s") {
		t.Errorf("Paused under a second = %+v", a)
	}
}

func TestWaitInstead(t *testing.T) {
	a := Advice{Action: "pause", RetryAfterS: 18, Reason: "Wait 18 s before the next call: the upstream asked to wait (Retry-After)."}
	if got := WaitInstead(a, time.Minute).Reason; !strings.HasSuffix(got, " Or call fetch with max_wait_s: 18, and the call waits for its turn itself.") {
		t.Errorf("WaitInstead = %q", got)
	}
	a.RetryAfterS = 61
	if got := WaitInstead(a, time.Minute); got != a {
		t.Errorf("WaitInstead beyond max_wait_s changed the advice: %q", got.Reason)
	}
	c := Advice{Action: "continue", Reason: "You can make 3 more calls in the next 40 s."}
	if got := WaitInstead(c, time.Minute); got != c {
		t.Errorf("WaitInstead changed a continue: %q", got.Reason)
	}
}

// TestCheck: the rules every advice keeps catch what was seen in a real
// run, and let through what mcp-quota says now.
func TestCheck(t *testing.T) {
	q := Quota{Key: "demo", Policy: "default", Limit: 10, Remaining: 4, ResetS: 31, WindowS: 60, Source: "local"}
	for _, tt := range []struct {
		name   string
		a      Advice
		q      Quota
		broken string // "" when the advice keeps the rules
	}{
		{"continue", Advice{"continue", 0, "You can make 4 more calls in the next 31 s."}, q, ""},
		{"continue in minutes", Advice{"continue", 0, "You can make 4 more calls in the next 4 min."}, Quota{Remaining: 4, ResetS: 200, WindowS: 3600}, ""},
		{"continue in a moment", Advice{"continue", 0, "You can make 4 more calls now."}, Quota{Remaining: 4, ResetS: 1, WindowS: 60}, ""},
		{"slow down", Advice{"slow_down", 0, "Only 1 of 20 calls are left under policy 'default'; spread them out, about one every 3 s."}, q, ""},
		{"slow down, spent for a moment", Advice{"slow_down", 0, "All 10 calls per 10 s allowed by policy 'default' are used; that ends in under a second, and a call made now waits for it."}, q, ""},
		{"pause", Advice{"pause", 18, "Wait 18 s before the next call: the upstream says 0 of 120 calls are left under policy 'default' for the next 18 s."}, q, ""},
		{"pause of one of several keys", Advice{"pause", 3, "Key 'demo': Wait 3 s before the next call: all 120 calls per 60 s allowed by policy 'default' are used."}, q, ""},
		{"pause in hours", Advice{"pause", 3900, "Wait 1 h 5 min before the next call: the upstream answered 429 and asked to wait 1 h 5 min (Retry-After)."}, q, ""},

		{"slow down while spent", Advice{"slow_down", 0, "All 10 calls per 10 s allowed by policy 'default' are used."}, q, "says a budget is spent"},
		{"milliseconds", Advice{"continue", 0, "You can make 4 more calls in the next 31 ms."}, q, "not a duration as a person says it"},
		{"reset beyond the window", Advice{"continue", 0, "You can make 4 more calls in the next 61 s."}, Quota{Remaining: 4, ResetS: 61, WindowS: 60}, "exceeds window_s"},
		{"pause without a wait", Advice{"pause", 0, "Wait 0 s before the next call."}, q, "retry_after_s 0"},
		{"pause saying less than it asks", Advice{"pause", 19, "Wait 18 s before the next call: …"}, q, `says "18 s", retry_after_s is 19`},
		{"continue with a wait", Advice{"continue", 3, "You can make 4 more calls in the next 31 s."}, q, "continue with retry_after_s 3"},
		{"continue with another count", Advice{"continue", 0, "You can make 5 more calls in the next 31 s."}, q, "says 5 more calls, the quota 4"},
		{"fractions", Advice{"slow_down", 0, "Spread them out, about one every 3.4 s."}, q, `"3.4 s" is not`},
		{"continue when spent", Advice{"continue", 0, "All 10 calls per 10 s allowed by policy 'default' are used; that ends in under a second."}, q, "continue says a budget is spent"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.a.Check(tt.q)
			switch {
			case tt.broken == "" && err != nil:
				t.Errorf("Check: %v", err)
			case tt.broken != "" && (err == nil || !strings.Contains(err.Error(), tt.broken)):
				t.Errorf("Check = %v, want an error saying %q", err, tt.broken)
			}
		})
	}
}
