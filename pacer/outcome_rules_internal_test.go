package pacer

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The instants the outcome's rules are tested at, ten seconds apart from
// t0 (see infer_test.go).
var (
	t1 = t0.Add(10 * time.Second)
	t2 = t0.Add(20 * time.Second)
	t3 = t0.Add(30 * time.Second)
	t4 = t0.Add(40 * time.Second)
	t5 = t0.Add(50 * time.Second)
	t9 = t0.Add(90 * time.Second)
)

// fakeView is what the outcome's rules read of a transaction, as defined:
// the key's state and policies, its log (sends, oldest first), warnings,
// and route failures, read by scanning them. The rule tests give it to
// the rules at fixed instants, with no database.
type fakeView struct {
	ks       ledger.KeyState
	seen     []ledger.SeenPolicy
	sends    []ledger.Send
	warnings []ledger.Warning
	paths    map[string]ledger.PathState // by scope
	failing  int                         // routes failing within the window asked
}

func (v *fakeView) KeyState(key string) (ledger.KeyState, error) { return v.ks, nil }

func (v *fakeView) SeenPolicies(key string) ([]ledger.SeenPolicy, error) { return v.seen, nil }

func (v *fakeView) after(since time.Time) []ledger.Send {
	var out []ledger.Send
	for _, s := range v.sends {
		if s.At.After(since) {
			out = append(out, s)
		}
	}
	return out
}

func (v *fakeView) Count(key string, since time.Time) (int, error) { return len(v.after(since)), nil }

func (v *fakeView) Nth(key string, since time.Time, n int) (time.Time, error) {
	if in := v.after(since); n >= 1 && n <= len(in) {
		return in[n-1].At, nil
	}
	return time.Time{}, nil
}

func (v *fakeView) Bytes(key string, since time.Time) (int64, error) { return 0, nil }

func (v *fakeView) Sends(key string, since time.Time, limit int) ([]ledger.Send, error) {
	in := v.after(since)
	return in[:min(limit, len(in))], nil
}

func (v *fakeView) Warned(key string, kind ledger.WarningKind, since time.Time) (bool, error) {
	for _, w := range v.warnings {
		if w.Key == key && w.Kind == kind && w.At.After(since) {
			return true, nil
		}
	}
	return false, nil
}

func (v *fakeView) PathState(key, scope string) (ledger.PathState, error) {
	if ps, ok := v.paths[scope]; ok {
		return ps, nil
	}
	return ledger.PathState{Key: key, Scope: scope}, nil
}

func (v *fakeView) FailingPaths(key string, since time.Time) (int, error) { return v.failing, nil }

var _ outcomeView = (*fakeView)(nil)

// ruleKey is the key the outcome's rule tests answer calls of.
var ruleKey = &keystore.Key{Name: "k", MaxRate: 1000, MaxConcurrency: 100}

// answered is the answer at answeredAt, with status and reading rd (nil for
// none), to the call with attempt ID 7 to GET /a admitted at admitted, in
// the key's state ks and with its policies seen.
func answered(admitted, answeredAt time.Time, status int, rd *ratelimit.Reading, ks ledger.KeyState, seen ...ledger.SeenPolicy) *answer {
	if rd != nil && rd.ReceivedAt.IsZero() {
		rd.ReceivedAt = answeredAt
	}
	t := Ticket{ID: 7, Call: Call{Key: ruleKey, Method: "GET", Target: "/a?page=2", CallID: "c", Attempt: 1}, AdmittedAt: admitted}
	o := Outcome{SentAt: admitted, AnsweredAt: answeredAt, Status: status, Reading: rd}
	return newAnswer(t, o, ks, seen, answeredAt)
}

// draws is a rand that always says r.
func draws(r float64) func() float64 { return func() float64 { return r } }

// noJitter fails t when a rule draws jitter it should not.
func noJitter(t *testing.T) func() float64 {
	return func() float64 {
		t.Helper()
		t.Error("the rule drew jitter")
		return 0
	}
}

// samePlan reports how got differs from want; the lease to end is Done's,
// compared by identity elsewhere.
func samePlan(t *testing.T, name string, got, want outcomePlan) {
	t.Helper()
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(outcomePlan{}, seenChange{}, finishing{}, slotRange{}, pathsBefore{}),
		cmpopts.IgnoreFields(outcomePlan{}, "endLease"), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("%s: plan (-want +got):\n%s", name, diff)
	}
}

// latencyNoted leaves out of a comparison what newAnswer notes of the
// key's latency (see margin_test.go).
var latencyNoted = cmpopts.IgnoreFields(ledger.KeyState{}, "Latency", "PrevLatency", "LatencySince")

// A Retry-After is the server's decision: the key is gated until it, and
// a tenth of it at most (of 10 s at most) of jitter only adds. A wait for
// the request's route alone sets no gate on the key, only the caller's
// wait; an answer without one draws no jitter and plans nothing.
func TestOutcomeRetryAfterRule(t *testing.T) {
	ra := func(d time.Duration, perRoute bool) *ratelimit.Reading {
		return &ratelimit.Reading{HasRetryAfter: true, RetryAfter: d, RetryAfterPerRoute: perRoute}
	}
	asked := reason.Reason{Kind: reason.RetryAfterAsked, Status: 429, For: 18 * time.Second}
	for _, tt := range []struct {
		name string
		rd   *ratelimit.Reading
		rand func() float64
		want outcomePlan
	}{
		{"18 s, half the jitter", ra(18*time.Second, false), draws(0.5), outcomePlan{
			gates: []ledger.Gate{{Key: "k", Until: t1.Add(18*time.Second + 500*time.Millisecond), Source: ledger.RetryAfterGate, SetAt: t1, Reason: asked}},
			res:   Result{RetryIn: 18*time.Second + 500*time.Millisecond}}},
		{"2 s, all the jitter", ra(2*time.Second, false), draws(0.999), outcomePlan{
			gates: []ledger.Gate{{Key: "k", Until: t1.Add(2*time.Second + 199800*time.Microsecond), Source: ledger.RetryAfterGate, SetAt: t1,
				Reason: reason.Reason{Kind: reason.RetryAfterAsked, Status: 429, For: 2 * time.Second}}},
			res: Result{RetryIn: 2*time.Second + 199800*time.Microsecond}}},
		{"per route", ra(18*time.Second, true), draws(0), outcomePlan{res: Result{RetryIn: 18 * time.Second}}},
		{"none", &ratelimit.Reading{}, noJitter(t), outcomePlan{}},
	} {
		a := answered(t0, t1, 429, tt.rd, ledger.KeyState{})
		samePlan(t, tt.name, a.retryAfter(tt.rand), tt.want)
	}
}

// Abnormal usage pauses the key for AbnormalPause, or the answer's longer
// Retry-After, with a warning naming the violated policies, and asks not to
// retry; an answer's own request not to retry is passed on alone.
func TestOutcomeAbnormalRule(t *testing.T) {
	abnormal := func(ra time.Duration) *ratelimit.Reading {
		return &ratelimit.Reading{Abnormal: true, HasRetryAfter: ra > 0, RetryAfter: ra,
			Problem: &ratelimit.Problem{ViolatedPolicies: []string{"burst", "daily"}}}
	}
	paused := func(until time.Time) outcomePlan {
		why := reason.Reason{Kind: reason.Abnormal, Key: "k", Violated: "burst daily", Until: until}
		return outcomePlan{
			gates:    []ledger.Gate{{Key: "k", Until: until, Source: ledger.AbnormalUsageGate, SetAt: t2, Reason: why}},
			warnings: []ledger.Warning{{Key: "k", At: t2, Kind: ledger.AbnormalUsageWarning, Reason: why}},
			res:      Result{Warnings: []reason.Reason{why}, DoNotRetry: true},
		}
	}
	for _, tt := range []struct {
		name string
		rd   *ratelimit.Reading
		want outcomePlan
	}{
		{"no Retry-After", abnormal(0), paused(t2.Add(AbnormalPause))},
		{"a shorter one", abnormal(time.Minute), paused(t2.Add(AbnormalPause))},
		{"a longer one", abnormal(time.Hour), paused(t2.Add(time.Hour))},
		{"do not retry", &ratelimit.Reading{DoNotRetry: true}, outcomePlan{res: Result{DoNotRetry: true}}},
		{"neither", &ratelimit.Reading{}, outcomePlan{}},
	} {
		a := answered(t1, t2, 403, tt.rd, ledger.KeyState{})
		samePlan(t, tt.name, a.abnormal(), tt.want)
	}
}

// A refusal nothing explains reveals a limit: inferred from the sends the
// upstream accepted before the refused call (not the call itself, nor a
// refused send), put as a hidden policy with a warning. A refusal whose
// problem names only policies known reveals nothing; one a documented
// policy's window explains (its whole quota answered within its window)
// warns of the window's edge instead; one while an earlier discovery was
// in flight is part of it.
func TestOutcomeHiddenLimitRule(t *testing.T) {
	sends := []ledger.Send{
		{ID: 1, At: t0, State: ledger.Confirmed, Status: 200, AnsweredAt: t0.Add(time.Second)},
		{ID: 2, At: t0.Add(time.Second), State: ledger.Confirmed, Status: 200, AnsweredAt: t0.Add(2 * time.Second)},
		{ID: 3, At: t0.Add(1500 * time.Millisecond), State: ledger.RejectedUpstream, Status: 429, AnsweredAt: t0.Add(2 * time.Second)},
		{ID: 4, At: t0.Add(2 * time.Second), State: ledger.Confirmed, Status: 200, AnsweredAt: t0.Add(3 * time.Second)},
		{ID: 7, At: t0.Add(3 * time.Second), State: ledger.Admitted},
	}
	refusal := func(violated ...string) *ratelimit.Reading {
		rd := &ratelimit.Reading{Throttled: true, HasRetryAfter: true, RetryAfter: 56 * time.Second}
		if len(violated) > 0 {
			rd.Problem = &ratelimit.Problem{ViolatedPolicies: violated}
		}
		return rd
	}
	at := t0.Add(4 * time.Second) // the refusal: the window ends 60 s after the first send
	inferred := func(name string) outcomePlan {
		why := reason.Reason{Kind: reason.HiddenLimit, Key: "k", Policy: name, Limit: 3, Window: time.Minute}
		return outcomePlan{
			seen: []seenChange{putSeen(ledger.SeenPolicy{Key: "k", ReceivedAt: at, BasisAt: t0, Hidden: true, Route: "GET /a",
				Observation: ratelimit.Observation{Policy: name, Unit: ratelimit.Requests, Quota: 3, HasQuota: true, Window: time.Minute,
					Shape: ratelimit.ShapeInferred}})},
			warnings: []ledger.Warning{{Key: "k", At: at, Kind: ledger.HiddenLimitWarning, Reason: why}},
			res:      Result{Warnings: []reason.Reason{why}},
		}
	}
	announced := ledger.SeenPolicy{Key: "k", ReceivedAt: t0, Observation: ratelimit.Observation{Policy: "burst", Unit: ratelimit.Requests,
		Quota: 3, HasQuota: true, Window: time.Second}}
	during := ledger.SeenPolicy{Key: "k", ReceivedAt: t0.Add(3500 * time.Millisecond), Hidden: true,
		Observation: ratelimit.Observation{Policy: "hidden", Unit: ratelimit.Requests, Window: time.Minute}}
	edge := reason.Reason{Kind: reason.WindowEdge, Key: "k", Policy: "minute", Limit: 3, Window: time.Minute}
	for _, tt := range []struct {
		name   string
		key    *keystore.Key
		rd     *ratelimit.Reading
		seen   []ledger.SeenPolicy
		warned []ledger.Warning
		want   outcomePlan
	}{
		{"nothing explains it", ruleKey, refusal(), nil, nil, inferred("hidden")},
		{"it names a policy nobody announced", ruleKey, refusal("burst", "daily"), []ledger.SeenPolicy{announced}, nil, inferred("daily")},
		{"it names only policies known", ruleKey, refusal("burst"), []ledger.SeenPolicy{announced}, nil, outcomePlan{}},
		{"discovered while it was in flight", ruleKey, refusal(), []ledger.SeenPolicy{during}, nil, outcomePlan{}},
		{"at a documented window's edge", documented(3, time.Minute), refusal(), nil, nil, outcomePlan{
			warnings: []ledger.Warning{{Key: "k", At: at, Kind: ledger.WindowEdgeWarning, Reason: edge}},
			res:      Result{Warnings: []reason.Reason{edge}}}},
		{"at its edge again within two windows", documented(3, time.Minute), refusal(), nil,
			[]ledger.Warning{{Key: "k", At: t0, Kind: ledger.WindowEdgeWarning, Reason: edge}}, inferred("hidden")},
	} {
		v := &fakeView{seen: tt.seen, sends: sends, warnings: tt.warned}
		a := answered(t0.Add(3*time.Second), at, 429, tt.rd, ledger.KeyState{}, tt.seen...)
		a.t.Call.Key = tt.key
		if !a.hidesLimit() {
			t.Fatalf("%s: a refusal nothing shows exhausted hides no limit", tt.name)
		}
		got, err := a.hiddenLimit(v, DefaultInFlightTimeout)
		if err != nil {
			t.Fatal(err)
		}
		samePlan(t, tt.name, got, tt.want)
	}
}

// documented is the rule tests' key with one documented policy "minute"
// of q calls per w.
func documented(q int64, w time.Duration) *keystore.Key {
	k := *ruleKey
	k.Policies = []keystore.Policy{{Name: "minute", Unit: ratelimit.Requests, Quota: q, Window: w}}
	return &k
}

// One policy past MaxPolicies evicts the one that holds calls back least
// (of equals, the oldest said), folded into the key's EvictedPolicy, and
// warns the first time; once a fold exists, a later eviction folds into it
// without a warning. Within the bound, nothing is planned.
func TestOutcomeBoundRule(t *testing.T) {
	windowed := func(i int) ledger.SeenPolicy {
		return ledger.SeenPolicy{Key: "k", ReceivedAt: t0.Add(time.Duration(i) * time.Second),
			Observation: ratelimit.Observation{Policy: fmt.Sprintf("p%02d", i), Unit: ratelimit.Requests, Quota: 100 + int64(i), HasQuota: true, Window: time.Minute}}
	}
	var full []ledger.SeenPolicy
	for i := range MaxPolicies + 1 {
		full = append(full, windowed(i))
	}
	fold := func(q int64, at time.Time) ledger.SeenPolicy {
		return ledger.SeenPolicy{Key: "k", ReceivedAt: at, BasisAt: at, Observation: ratelimit.Observation{Policy: EvictedPolicy,
			Unit: ratelimit.Requests, Shape: shapeFolded, Quota: q, HasQuota: true, Window: time.Minute}}
	}
	unfold := deleteSeen(ledger.SeenPolicy{Key: "k", Observation: ratelimit.Observation{Policy: EvictedPolicy, Unit: ratelimit.Requests}})
	bounded := reason.Reason{Kind: reason.PolicyBound, Key: "k", Limit: MaxPolicies, Buckets: MaxRouteBuckets, Policy: EvictedPolicy}
	for _, tt := range []struct {
		name string
		seen []ledger.SeenPolicy
		want outcomePlan
	}{
		{"within the bound", full[1:], outcomePlan{}},
		{"one past it", full, outcomePlan{
			seen:     []seenChange{deleteSeen(full[0]), unfold, putSeen(fold(100, t5))},
			warnings: []ledger.Warning{{Key: "k", At: t5, Kind: ledger.PolicyBoundWarning, Reason: bounded}},
			res:      Result{Warnings: []reason.Reason{bounded}}}},
		{"one past it, folded before", append([]ledger.SeenPolicy{fold(50, t0)}, full...), outcomePlan{
			seen: []seenChange{deleteSeen(full[0]), unfold, putSeen(fold(50, t0))}}},
	} {
		got, err := bound(&fakeView{seen: tt.seen}, ruleKey, t5, t5)
		if err != nil {
			t.Fatal(err)
		}
		samePlan(t, tt.name, got, tt.want)
	}
}

// A server error with no rate-limit signal is its route's: the route
// backs off (and, at BreakerThreshold failures, its circuit opens, with a
// warning), old route failures are forgotten. Once PathSpread routes fail
// within PathWindow, it is the key's: only the forgetting is planned. A
// refusal is never a route's.
func TestOutcomeRouteFailureRule(t *testing.T) {
	scope := routePartition("GET /a")
	forget := &pathsBefore{key: "k", before: t9.Add(-pathMemory)}
	backedOff := func(failures int, wait time.Duration) outcomePlan {
		ps := ledger.PathState{Key: "k", Scope: scope, Failures: failures, LastAt: t9}
		return outcomePlan{forget: forget, path: &ps, res: Result{RetryIn: wait},
			gates: []ledger.Gate{{Key: "k", Scope: scope, Until: t9.Add(wait), Source: ledger.BackoffGate, SetAt: t9,
				Reason: reason.Reason{Kind: reason.RouteBackOff, Status: 503, Route: "GET /a", Failures: int64(failures), Window: PathWindow}}}}
	}
	opened := reason.Reason{Kind: reason.RouteCircuit, Route: "GET /a", Key: "k", For: BreakerCooldown}
	openPS := ledger.PathState{Key: "k", Scope: scope, Opens: 1, HalfOpen: true, LastAt: t9}
	for _, tt := range []struct {
		name      string
		status    int
		paths     map[string]ledger.PathState
		failing   int
		routeOnly bool
		want      outcomePlan
	}{
		{"the first", 503, nil, 0, true, backedOff(1, 1500*time.Millisecond)},
		{"the third in the window", 503, map[string]ledger.PathState{scope: {Key: "k", Scope: scope, Failures: 2, LastAt: t5}}, 1, true,
			backedOff(3, RetryFloor+2*time.Second)},
		{"one long forgotten", 503, map[string]ledger.PathState{scope: {Key: "k", Scope: scope, Failures: 4, Opens: 3, LastAt: t9.Add(-2 * pathMemory)}}, 0, true,
			backedOff(1, 1500*time.Millisecond)},
		{"the fifth: its circuit opens", 503, map[string]ledger.PathState{scope: {Key: "k", Scope: scope, Failures: 4, LastAt: t5}}, 1, true, outcomePlan{
			forget: forget, path: &openPS, res: Result{RetryIn: BreakerCooldown, Warnings: []reason.Reason{opened}},
			gates:    []ledger.Gate{{Key: "k", Scope: scope, Until: t9.Add(BreakerCooldown), Source: ledger.CircuitGate, SetAt: t9, Reason: opened}},
			warnings: []ledger.Warning{{Key: "k", At: t9, Kind: ledger.CircuitOpenWarning, Reason: opened}}}},
		{"failures spread", 503, nil, PathSpread - 1, false, outcomePlan{forget: forget}},
		{"a refusal", 429, nil, 0, false, outcomePlan{}},
	} {
		a := answered(t4, t9, tt.status, &ratelimit.Reading{}, ledger.KeyState{})
		got, routeOnly, err := a.routeFailure(&fakeView{paths: tt.paths, failing: tt.failing}, draws(0.5))
		if err != nil {
			t.Fatal(err)
		}
		if routeOnly != tt.routeOnly {
			t.Errorf("%s: the route's alone: %v; want %v", tt.name, routeOnly, tt.routeOnly)
		}
		samePlan(t, tt.name, got, tt.want)
	}
}

// The circuit breaker: a failure without guidance backs off (its jitter
// on top of RetryFloor, doubling), the BreakerThreshold-th opens the
// circuit, a failed half-open probe reopens it for twice as long; a
// refusal too short to trust backs off and says so; a guided refusal only
// slows the key; a success closes the circuit; a call the caller gave up
// on teaches nothing; a route's own failure leaves the key as it was.
func TestOutcomeBreakerRule(t *testing.T) {
	slow := slowStart(ruleKey, nil)
	backOff := func(status, n int, d time.Duration, short bool) outcomePlan {
		why := reason.Reason{Kind: reason.BackOff, Status: status, Failures: int64(n), Short: short}
		return outcomePlan{res: Result{RetryIn: d},
			gates: []ledger.Gate{{Key: "k", Until: t3.Add(d), Source: ledger.BackoffGate, SetAt: t3, Reason: why}}}
	}
	circuit := func(kind reason.Kind, cool time.Duration) outcomePlan {
		why := reason.Reason{Kind: kind, Key: "k", Failures: BreakerThreshold, For: cool}
		return outcomePlan{res: Result{RetryIn: cool, Warnings: []reason.Reason{why}},
			gates:    []ledger.Gate{{Key: "k", Until: t3.Add(cool), Source: ledger.CircuitGate, SetAt: t3, Reason: why}},
			warnings: []ledger.Warning{{Key: "k", At: t3, Kind: ledger.CircuitOpenWarning, Reason: why}}}
	}
	for _, tt := range []struct {
		name      string
		status    int
		rd        *ratelimit.Reading
		ks        ledger.KeyState
		routeOnly bool
		abort     bool
		want      outcomePlan
		wantKS    ledger.KeyState
	}{
		{"a first 503", 503, nil, ledger.KeyState{}, false, false, backOff(503, 1, 1500*time.Millisecond, false),
			ledger.KeyState{Failures: 1, Interval: slow}},
		{"a third 500", 500, nil, ledger.KeyState{Failures: 2}, false, false, backOff(500, 3, RetryFloor+2*time.Second, false),
			ledger.KeyState{Failures: 3, Interval: slow}},
		{"a refusal saying 0 s", 429, &ratelimit.Reading{HasRetryAfter: true}, ledger.KeyState{}, false, false,
			backOff(429, 1, 1500*time.Millisecond, true), ledger.KeyState{Failures: 1, Interval: slow}},
		{"the fifth: it opens", 503, nil, ledger.KeyState{Failures: 4}, false, false, circuit(reason.CircuitOpen, BreakerCooldown),
			ledger.KeyState{Opens: 1, HalfOpen: true, Interval: slow}},
		{"its probe fails: it reopens", 503, nil, ledger.KeyState{Opens: 1, HalfOpen: true, ProbeAttempt: 7}, false, false,
			circuit(reason.CircuitReopen, 2*BreakerCooldown), ledger.KeyState{Opens: 2, HalfOpen: true, ProbeAttempt: 7, Interval: slow}},
		{"a guided refusal", 429, &ratelimit.Reading{HasRetryAfter: true, RetryAfter: time.Minute}, ledger.KeyState{Failures: 2}, false, false,
			outcomePlan{}, ledger.KeyState{Failures: 2, Interval: slow}},
		// Abnormal usage pauses the key on its own (see abnormal): it
		// is no failure towards the circuit, which would open on it.
		{"abnormal usage without a wait", 429, &ratelimit.Reading{Abnormal: true}, ledger.KeyState{Failures: 4}, false, false,
			outcomePlan{}, ledger.KeyState{Failures: 4, Interval: slow}},
		{"a success closes it", 200, nil, ledger.KeyState{Failures: 3, Opens: 2, HalfOpen: true}, false, false, outcomePlan{}, ledger.KeyState{}},
		{"the caller gave up", 0, nil, ledger.KeyState{Failures: 3}, false, true, outcomePlan{}, ledger.KeyState{Failures: 3}},
		{"its route's alone", 503, nil, ledger.KeyState{Failures: 3}, true, false, outcomePlan{}, ledger.KeyState{Failures: 3}},
	} {
		a := answered(t2, t3, tt.status, tt.rd, tt.ks)
		if tt.abort {
			a = newAnswer(a.t, Outcome{SentAt: t2, Err: fmt.Errorf("body too large"), CallerAbort: true}, tt.ks, nil, t3)
		}
		got, ks := a.breaker(tt.routeOnly, draws(0.5))
		samePlan(t, tt.name, got, tt.want)
		if diff := cmp.Diff(tt.wantKS, ks, latencyNoted); diff != "" {
			t.Errorf("%s: key state (-want +got):\n%s", tt.name, diff)
		}
	}
}

// close ends the probe the answered call was (and no other), moves the
// key's last answer to the answer's time (not when none came), and ends
// the attempt: a lease's slot as a slot.
func TestOutcomeCloseRule(t *testing.T) {
	probing := ledger.KeyState{ProbeAttempt: 7, ProbeUntil: t9, LastResponseAt: t0}
	for _, tt := range []struct {
		name   string
		ks     ledger.KeyState
		status int
		leased bool
		wantKS ledger.KeyState
		state  ledger.State
	}{
		{"its probe's answer", probing, 200, false, ledger.KeyState{LastResponseAt: t3}, ledger.Confirmed},
		{"another's probe", ledger.KeyState{ProbeAttempt: 8, ProbeUntil: t9}, 202, false,
			ledger.KeyState{ProbeAttempt: 8, ProbeUntil: t9, LastResponseAt: t3}, ledger.Accepted},
		{"its probe, no answer", probing, 0, false, ledger.KeyState{LastResponseAt: t0}, ledger.Failed},
		{"a slot's", ledger.KeyState{}, 404, true, ledger.KeyState{LastResponseAt: t3}, ledger.RejectedUpstream},
	} {
		a := answered(t2, t3, tt.status, nil, tt.ks)
		if tt.status == 0 {
			a = newAnswer(a.t, Outcome{SentAt: t2, Err: fmt.Errorf("reset")}, tt.ks, nil, t3)
		}
		if tt.leased {
			a.t.lease = &lease{key: "k"}
		}
		got := a.close(a.ks)
		f := finishing{attempt: finished(a.t, a.o, tt.state), slot: tt.leased}
		samePlan(t, tt.name, outcomePlan{finish: got.finish}, outcomePlan{finish: &f})
		if diff := cmp.Diff(tt.wantKS, *got.keyState, latencyNoted); diff != "" {
			t.Errorf("%s: key state (-want +got):\n%s", tt.name, diff)
		}
		if got.finish.attempt.State != tt.state {
			t.Errorf("%s: the attempt ends %s; want %s", tt.name, got.finish.attempt.State, tt.state)
		}
	}
}

// An answer's observations are kept with their context (a cached one
// too), and each fresh one becomes its policy's latest; the answer grew
// the policies when one was new, and shows one exhausted. A leaky
// bucket's rate and a window's end are learned from the log (see
// tighten_test.go, and TestLearnLeak).
func TestOutcomeObserveRule(t *testing.T) {
	ob := func(policy string, r int64) ratelimit.Observation {
		return ratelimit.Observation{Policy: policy, Unit: ratelimit.Requests, Quota: 10, HasQuota: true, Remaining: r, HasRemaining: true,
			Window: time.Minute}
	}
	seen := ledger.SeenPolicy{Key: "k", ReceivedAt: t0, Observation: ob("minute", 5)}
	for _, tt := range []struct {
		name            string
		cached          bool
		obs             []ratelimit.Observation
		grew, exhausted bool
		puts            int
	}{
		{"a policy seen", false, []ratelimit.Observation{ob("minute", 4)}, false, false, 1},
		{"a new one, exhausted", false, []ratelimit.Observation{ob("minute", 3), ob("hour", 0)}, true, true, 2},
		{"from a cache", true, []ratelimit.Observation{ob("hour", 0)}, false, true, 0},
	} {
		rd := &ratelimit.Reading{Observations: tt.obs, FromCache: tt.cached}
		a := answered(t2, t3, 200, rd, ledger.KeyState{}, seen)
		got, err := a.observe(&fakeView{})
		if err != nil {
			t.Fatal(err)
		}
		if a.grew != tt.grew || a.exhausted != tt.exhausted {
			t.Errorf("%s: grew %v, exhausted %v; want %v, %v", tt.name, a.grew, a.exhausted, tt.grew, tt.exhausted)
		}
		if len(got.observations) != len(tt.obs) || len(got.seen) != tt.puts {
			t.Fatalf("%s: %d observations and %d policies put; want %d and %d", tt.name, len(got.observations), len(got.seen), len(tt.obs), tt.puts)
		}
		for i, c := range got.seen {
			want := ledger.SeenPolicy{Key: "k", Observation: tt.obs[i], ReceivedAt: t3, BasisAt: t2, Route: "GET /a"}
			if c.delete || !cmp.Equal(c.policy, want) {
				t.Errorf("%s: put %d: %+v; want %+v", tt.name, i, c, want)
			}
		}
		for i, rec := range got.observations {
			if rec.AttemptID != 7 || rec.Status != 200 || rec.Target != "/a?page=2" || rec.FromCache != tt.cached {
				t.Errorf("%s: observation %d kept as %+v", tt.name, i, rec)
			}
		}
	}
}

// Parts add up: writes and warnings in order, the longest wait, either's
// request not to retry, and what a part sets alone replaced.
func TestOutcomePlanAdd(t *testing.T) {
	ks1, ks2 := ledger.KeyState{Failures: 1}, ledger.KeyState{Failures: 2}
	w1, w2 := reason.Reason{Kind: reason.Abnormal}, reason.Reason{Kind: reason.HiddenLimit}
	var p outcomePlan
	p.add(outcomePlan{res: Result{State: ledger.RejectedUpstream, RetryIn: 3 * time.Second, Warnings: []reason.Reason{w1}}, keyState: &ks1,
		gates: []ledger.Gate{{Source: ledger.RetryAfterGate}}})
	p.add(outcomePlan{res: Result{RetryIn: time.Second, DoNotRetry: true, Warnings: []reason.Reason{w2}}, keyState: &ks2,
		gates: []ledger.Gate{{Source: ledger.BackoffGate}}})
	want := outcomePlan{res: Result{State: ledger.RejectedUpstream, RetryIn: 3 * time.Second, DoNotRetry: true, Warnings: []reason.Reason{w1, w2}},
		keyState: &ks2, gates: []ledger.Gate{{Source: ledger.RetryAfterGate}, {Source: ledger.BackoffGate}}}
	samePlan(t, "two parts", p, want)
}
