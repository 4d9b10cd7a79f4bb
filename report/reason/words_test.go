package reason

import (
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

func TestDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0 s"},
		{0, "0 s"},
		{time.Microsecond, "under a second"},
		{31 * time.Millisecond, "under a second"},
		{999 * time.Millisecond, "under a second"},
		{time.Second, "1 s"},
		{1500 * time.Millisecond, "2 s"}, // rounded up, as retry_after_s is
		{31 * time.Second, "31 s"},
		{42*time.Second + time.Millisecond, "43 s"},
		{time.Minute, "60 s"},
		{119 * time.Second, "119 s"},
		{119*time.Second + time.Millisecond, "2 min"},
		{3*time.Minute + 20*time.Second, "4 min"},
		{59 * time.Minute, "59 min"},
		{59*time.Minute + time.Second, "1 h"},
		{time.Hour + 5*time.Minute, "1 h 5 min"},
		{time.Hour + 4*time.Minute + time.Second, "1 h 5 min"},
		{26 * time.Hour, "26 h"},
	} {
		if got := Duration(tt.d); got != tt.want {
			t.Errorf("Duration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestPace(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{3400 * time.Millisecond, "about one every 4 s"},
		{500 * time.Millisecond, "about 2 a second"},
		{300 * time.Millisecond, "about 3 a second"},
		{900 * time.Millisecond, "about one a second"},
		{6 * time.Minute, "about one every 6 min"},
	} {
		if got := pace(tt.d); got != tt.want {
			t.Errorf("pace(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestHowMany(t *testing.T) {
	tests := []struct {
		n    int64
		unit ratelimit.Unit
		want string
	}{
		{1, ratelimit.Requests, "1 call is"},
		{0, ratelimit.Requests, "0 calls are"},
		{119, "", "119 calls are"},
		{1, ratelimit.ContentBytes, "1 content byte is"},
		{2048, ratelimit.ContentBytes, "2048 content bytes are"},
	}
	for _, tt := range tests {
		if got := howMany(tt.n, tt.unit); got != tt.want {
			t.Errorf("howMany(%d, %q) = %q, want %q", tt.n, tt.unit, got, tt.want)
		}
	}
}

func TestGrouped(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 12: "12", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1000: "-1,000"} {
		if got := Grouped(n); got != want {
			t.Errorf("Grouped(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSentence(t *testing.T) {
	for s, want := range map[string]string{"": "", "calls wait": "Calls wait.", "Done.": "Done.", "key 'a': x.": "Key 'a': x."} {
		if got := Sentence(s); got != want {
			t.Errorf("Sentence(%q) = %q, want %q", s, got, want)
		}
	}
}

// TestString: every kind of reason, as mcp-quota says it. Agents and the
// end-to-end tests read these phrases: a change here is a change of what
// mcp-quota tells its callers.
func TestString(t *testing.T) {
	for _, tt := range []struct {
		r    Reason
		want string
	}{
		{Reason{}, ""},
		{Reason{Kind: Said, Source: "retry-after", Said: "the upstream asked to wait"}, "the upstream asked to wait"},
		{Reason{Kind: WindowSpent, Policy: "default", Limit: 120, Window: time.Minute},
			"all 120 calls per 60 s allowed by policy 'default' are used"},
		{Reason{Kind: WindowSpent, Policy: "default", Limit: 10, Window: time.Minute, Held: 3},
			"all 10 calls per 60 s allowed by policy 'default' are used (3 of them are kept for other callers' reservations)"},
		{Reason{Kind: WindowLow, Policy: "default", Left: 1, Limit: 20, Spacing: 3 * time.Second},
			"only 1 of 20 calls is left under policy 'default', so calls are spread 3 s apart"},
		{Reason{Kind: WindowLow, Policy: "default", Left: 2, Limit: 20, Spacing: 500 * time.Millisecond},
			"only 2 of 20 calls are left under policy 'default', so calls are spread less than a second apart"},
		{Reason{Kind: UpstreamLow, Policy: "hour", Unit: ratelimit.Requests, Left: 4, For: 40 * time.Second, Spacing: 8 * time.Second},
			"the upstream says 4 calls are left for the next 40 s under policy 'hour', so calls are spread 8 s apart"},
		{Reason{Kind: UpstreamSpent, Policy: "default", Unit: ratelimit.Requests, Limit: 120, For: 18 * time.Second},
			"the upstream says 0 of 120 calls are left under policy 'default' for the next 18 s"},
		{Reason{Kind: UpstreamSpent, Policy: "up", Unit: ratelimit.ContentBytes, For: 300 * time.Millisecond},
			"the upstream says 0 content bytes are left under policy 'up' for under a second"},
		{Reason{Kind: UpstreamShort, Policy: "upload", Unit: ratelimit.ContentBytes, Left: 300, For: 20 * time.Second, Carries: 1301},
			"the upstream says 300 content bytes are left under policy 'upload' for the next 20 s, fewer than the 1,301 content bytes the request carries"},
		{Reason{Kind: ProbeAsking}, "a probe is asking the upstream for a fresh answer and calls wait for it"},
		{Reason{Kind: ProbeDue, Policy: "default", For: 2 * time.Second},
			"the upstream's last word on policy 'default' has expired, and one probe goes in 2 s to get a fresh one"},
		{Reason{Kind: InFlight, InFlight: 4}, "4 calls are in flight, the most allowed at once for this key"},
		{Reason{Kind: Spaced, Spacing: 250 * time.Millisecond}, "calls are spaced less than a second apart"},
		{Reason{Kind: BytesNever, Policy: "bytes", Carries: 1001, Limit: 1000, Window: time.Minute},
			"the request carries 1,001 content-bytes, more than the 1,000 that policy 'bytes' allows in any 60 s: it can never go as it is; send a smaller body"},
		{Reason{Kind: BytesShort, Policy: "bytes", Left: 100, Limit: 1000, Window: time.Minute, Carries: 101},
			"100 of 1,000 content-bytes per 60 s are left under policy 'bytes', and the request carries 101"},
		{Reason{Kind: ConcurrencyFull, Policy: "conc", Limit: 2, InFlight: 2},
			"all 2 concurrent requests allowed by policy 'conc' are in flight, and the next starts when one of them ends"},
		{Reason{Kind: ConcurrencyFull, Policy: "conc", InFlight: 1},
			"1 concurrent requests are in flight, as many as the upstream's last answer allows under policy 'conc', and the next starts when one of them ends"},
		{Reason{Kind: ShareSpent, Principal: "sync", Share: 0.4, Used: 12, Limit: 30, Window: time.Minute, Policy: "default", Left: 15},
			"principal 'sync' has used its share of the key: 12 of the 30 calls per 60 s of policy 'default' (40%), " +
				"and it comes back as they leave the window; the key itself has 15 left for the others"},
		{Reason{Kind: Turn, Other: "alice", Behind: 1, Principal: "sync", Used: 9, Left: 3},
			"principals waiting for this key take turns by their shares, and principal 'alice' (1 of this window's calls) " +
				"is further behind than principal 'sync' (9); the next of the 3 calls left go to those further behind"},
		{Reason{Kind: BucketFull, Policy: "bucket", Limit: 40, Rate: 2, For: 500 * time.Millisecond},
			"the upstream's bucket 'bucket' is full (40 calls) and leaks about 2 calls a second, so the next call fits in under a second"},
		{Reason{Kind: RetryAfterAsked, Status: 429, For: 18 * time.Second}, "the upstream answered 429 and asked to wait 18 s (Retry-After)"},
		{Reason{Kind: Abnormal, Key: "demo", Until: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)},
			"the upstream reported abnormal usage of key 'demo'; calls are paused until 2026-12-02T03:00:00Z — check what is calling it before resuming"},
		{Reason{Kind: Abnormal, Key: "demo", Violated: "burst day", Until: time.Date(2026, 12, 2, 3, 0, 0, 0, time.FixedZone("CET", 3600))},
			"the upstream reported abnormal usage of key 'demo' (violated policies: [burst day]); calls are paused until 2026-12-02T02:00:00Z — check what is calling it before resuming"},
		{Reason{Kind: CircuitOpen, Key: "demo", Failures: 5, For: 30 * time.Second},
			"the circuit for key 'demo' opened after 5 refusals or failures without guidance, and one probe goes in 30 s"},
		{Reason{Kind: CircuitReopen, Key: "demo", For: 4 * time.Minute},
			"the circuit for key 'demo' opened again because its probe failed too, and the next probe goes in 4 min"},
		{Reason{Kind: BackOff, Status: 503, Failures: 2}, "the upstream answered 503 without saying when to come back, so calls back off (failure 2 in a row)"},
		{Reason{Kind: BackOff, Failures: 1}, "the upstream answered nothing (the request failed) without saying when to come back, so calls back off (failure 1 in a row)"},
		{Reason{Kind: BackOff, Status: 429, Failures: 3, Short: true},
			"the upstream answered 429 and asked to wait only 0 s, too short to trust, so calls back off (failure 3 in a row)"},
		{Reason{Kind: RouteBackOff, Status: 500, Route: "GET /bad", Failures: 2, Window: time.Minute},
			"the upstream answered 500 to GET /bad without a rate-limit signal, so calls on that route back off (failure 2 on it within 60 s); other routes of the key go on"},
		{Reason{Kind: RouteCircuit, Route: "GET /bad", Key: "demo", For: 30 * time.Second},
			"the circuit for GET /bad of key 'demo' opened after failures without a rate-limit signal, for 30 s; other routes of the key go on"},
		{Reason{Kind: HiddenLimit, Key: "demo", Policy: "hidden-1", Limit: 10, Window: time.Minute},
			"key 'demo' hit a limit the upstream never announced ('hidden-1'); it is now enforced locally as 10 calls per 60 s"},
		{Reason{Kind: HiddenStretched, Key: "demo", Policy: "hidden-1", Limit: 10, Window: 5 * time.Minute},
			"key 'demo' was refused again by the limit the upstream never announced ('hidden-1'); its window is longer than it seemed, and it is now enforced locally as 10 calls per 5 min"},
		{Reason{Kind: HiddenUnaccepted, Key: "demo", Policy: "hidden-1"},
			"key 'demo' was refused by a limit the upstream never announced ('hidden-1') before any call of it was accepted; calls wait for the upstream's Retry-After or back off"},
		{Reason{Kind: WindowEdge, Key: "demo", Policy: "default", Limit: 30, Window: 6 * time.Second},
			"key 'demo' was refused by the upstream for a call sent as policy 'default' (30 calls per 6 s) freed a slot; it reached the upstream a moment before the upstream's own window freed it, and calls wait as the refusal asks"},
		{Reason{Kind: PolicyBound, Key: "demo", Limit: 64, Buckets: 256, Policy: "folded"},
			"the upstream of key 'demo' announced more than mcp-quota keeps for one key (64 policies, 256 route buckets); the least restrictive are dropped, and those that still bind are folded into policy 'folded', at least as tight as each of them"},
		{Reason{Kind: Late, For: 1234567 * time.Microsecond, Allowed: 250 * time.Millisecond},
			"not sent: it would have left 1.235s after its admission, later than the 250ms its window's margin allows; the call is admitted again"},
		{Reason{Kind: Answered, Status: 503}, "HTTP 503 Service Unavailable"},
		{RefusedFor(1500*time.Millisecond, Reason{Kind: WindowSpent, Policy: "default", Limit: 120, Window: time.Minute}),
			"refused locally, retry after 2 s: all 120 calls per 60 s allowed by policy 'default' are used"},
		{RefusedFor(0, Reason{Kind: Said, Said: "a gate kept as words"}), "refused locally, retry after 0 s: a gate kept as words"},
		{Reason{Kind: Failed, Error: `Get "http://up/x": dial tcp: connection refused`}, `Get "http://up/x": dial tcp: connection refused`},
		{Reason{Kind: Interrupted}, "the process handling it ended before an answer was recorded"},
		{Reason{Kind: Unreported}, "reserved by a process that ended before reporting it: counted as sent, whether or not it was"},
		{Reason{Kind: Unneeded}, "reserved for a batch of calls and not needed; counted, since later admissions follow it"},
		{Reason{Kind: Reserved}, "reserved for a batch of calls of one process, taken without a transaction each"},
		{Reason{Kind: KeptPage, For: 90 * time.Second}, "page read from the answer kept 90 s ago"},
		{Reason{Kind: LoopGuard}, "loop guard: identical request, unchanged answer"},
		{Reason{Kind: CallsLeft, Left: 1, For: 40 * time.Second}, "You can make 1 more call in the next 40 s"},
		{Reason{Kind: CallsLeft, Left: 12, For: 500 * time.Millisecond}, "You can make 12 more calls now"},
		{Reason{Kind: BytesLeft, Policy: "bytes", Left: 120, Limit: 1000000, For: 30 * time.Second},
			"120 of 1,000,000 content-bytes are left under policy 'bytes' for the next 30 s"},
		{Reason{Kind: InFlightOf, Policy: "conc", Used: 3, Limit: 4, Left: 1}, "3 of 4 concurrent requests are in flight under policy 'conc'"},
		{Reason{Kind: InFlightOf, Policy: "conc", Used: 3, Left: 1}, "3 concurrent requests are in flight under policy 'conc', and 1 more may start"},
		{Reason{Kind: NoLimit}, "no limit is known to bind this key right now; go ahead at a steady pace"},
	} {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.r.Kind, got, tt.want)
		}
	}
}

// TestAdvice: advice as one sentence that agrees with its action.
func TestAdvice(t *testing.T) {
	spent := Reason{Kind: WindowSpent, Policy: "default", Limit: 120, Window: time.Minute}
	for _, tt := range []struct {
		action string
		after  time.Duration
		why    Reason
		want   string
	}{
		{Pause, 2300 * time.Millisecond, spent, "Wait 3 s before the next call: all 120 calls per 60 s allowed by policy 'default' are used."},
		{SlowDown, 0, spent, "All 120 calls per 60 s allowed by policy 'default' are used; that ends in under a second, and a call made now waits for it."},
		{SlowDown, 0, Reason{Kind: WindowLow, Policy: "default", Left: 1, Limit: 20, Spacing: 3 * time.Second},
			"Only 1 of 20 calls is left under policy 'default'; spread them out, about one every 3 s."},
		{SlowDown, 0, Reason{Kind: UpstreamLow, Policy: "hour", Left: 4, For: 40 * time.Second, Spacing: 8 * time.Second},
			"You can make 4 more calls in the next 40 s; spread them out, about one every 8 s."},
		{SlowDown, 0, Reason{Kind: UpstreamLow, Policy: "hour", Left: 4, For: 40 * time.Second},
			"You can make 4 more calls in the next 40 s."},
		{SlowDown, 0, Reason{Kind: InFlightOf, Policy: "conc", Used: 4, Limit: 4},
			"4 of 4 concurrent requests are in flight under policy 'conc'; a call made now waits until one of them ends."},
		{Continue, 0, Reason{Kind: CallsLeft, Left: 3, For: 5 * time.Second}, "You can make 3 more calls in the next 5 s."},
		{Continue, 0, Reason{Kind: BytesLeft, Policy: "bytes", Left: 120, Limit: 1000000, For: 30 * time.Second},
			"120 of 1,000,000 content-bytes are left under policy 'bytes' for the next 30 s."},
		{Continue, 0, Reason{Kind: NoLimit}, "No limit is known to bind this key right now; go ahead at a steady pace."},
	} {
		if got := Advice(tt.action, tt.after, tt.why); got != tt.want {
			t.Errorf("Advice(%s, %v, %s):\n got %q\nwant %q", tt.action, tt.after, tt.why.Kind, got, tt.want)
		}
	}
}

func TestPausedAndRefused(t *testing.T) {
	why := Reason{Kind: Spaced, Spacing: 2 * time.Second}
	if got, want := Paused("demo", 1500*time.Millisecond, why), "key demo paused for 2 s: calls are spaced 2 s apart"; got != want {
		t.Errorf("Paused = %q, want %q", got, want)
	}
	if got, want := Refused(1500*time.Millisecond, why), "refused locally, retry after 2 s: calls are spaced 2 s apart"; got != want {
		t.Errorf("Refused = %q, want %q", got, want)
	}
}

// Map rewrites every text a reason carries, and nothing else.
func TestMap(t *testing.T) {
	r := Reason{Kind: Said, Policy: "p-secret", Principal: "a", Other: "b", Source: "s", Said: "said secret", Key: "k", Route: "GET /secret",
		Violated: "secret", Limit: 3, For: time.Second, Error: "dial secret"}
	got := r.Map(func(s string) string { return strings.ReplaceAll(s, "secret", "***") })
	want := Reason{Kind: Said, Policy: "p-***", Principal: "a", Other: "b", Source: "s", Said: "said ***", Key: "k", Route: "GET /***",
		Violated: "***", Limit: 3, For: time.Second, Error: "dial ***"}
	if got != want {
		t.Errorf("Map:\n got %+v\nwant %+v", got, want)
	}
}
