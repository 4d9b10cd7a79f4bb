package pacer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// An upstream's r is a hint counted down by every send made after the
// request that observed it, by any caller in any process sharing the
// state file.
func TestRemainingCountsDownEverySendSince(t *testing.T) {
	e := newEnv(t)
	_, other := e.open() // a second process on the same file
	k := newKey()
	e.send(k, "agent", 200, reading(0, shown("default", 120, time.Minute, 3, 42*time.Second)))

	e.clk.advance(time.Second)
	e.mustAdmit(k, "agent", "/a")
	e.clk.advance(time.Second)
	if _, err := e.admitWith(other, e.call(k, "sync", "/b")); err != nil {
		t.Fatalf("second process: got %v, want admitted", err)
	}
	e.clk.advance(time.Second)
	e.mustAdmit(k, "sync", "/c")
	e.clk.advance(time.Second)
	pe := e.mustPause(k, "agent", "/d")
	if got, want := pe.RetryAfter, 38*time.Second; got != want {
		t.Errorf("pause: got retry after %v, want %v (what is left of t)", got, want)
	}
	if pe.Source != "default" {
		t.Errorf("pause: got source %q, want the policy 'default'", pe.Source)
	}
	// The second process sees the same.
	if pe2 := mustPause(t, e.clk, other, e.call(k, "sync", "/e")); pe2.RetryAfter != pe.RetryAfter {
		t.Errorf("second process: got retry after %v, want %v", pe2.RetryAfter, pe.RetryAfter)
	}
}

// A value is projected only within its own partition: a route seen in one
// partition is paced by that partition's r alone, and a route never seen
// by every partition (the safe guess).
func TestPartitionsAreProjectedApart(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	inPartition := func(pk string, r int64) *ratelimit.Reading {
		o := shown("core", 0, 0, r, time.Minute)
		o.Partition = pk
		return reading(0, o)
	}
	e.answer(e.mustAdmit(k, "agent", "/repos"), 200, inPartition("core", 50))
	e.clk.advance(time.Second)
	e.answer(e.mustAdmit(k, "agent", "/search?q=1"), 200, inPartition("search", 0))

	e.clk.advance(time.Second)
	e.mustAdmit(k, "agent", "/repos?page=2") // same route, query aside
	if pe := e.mustPause(k, "agent", "/search?q=2"); pe.Source != "core" {
		t.Errorf("search: got source %q, want 'core'", pe.Source)
	}
	if pe := e.mustPause(k, "agent", "/unknown"); pe.RetryAfter != time.Minute-time.Second || pe.Source != "core" {
		t.Errorf("a route never seen: got %s for %v, want the exhausted partition's %v", pe.Source, pe.RetryAfter, time.Minute-time.Second)
	}
}

// Units other than requests are not counted down by calls, and are
// projected in their own unit.
func TestOtherUnitsAreNotCountedInCalls(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	tokens := func(r int64) *ratelimit.Reading {
		return reading(0, ratelimit.Observation{Policy: "tokens", Unit: ratelimit.Tokens, Quota: 1000, HasQuota: true,
			Remaining: r, HasRemaining: true, Reset: time.Minute, HasReset: true, Shape: ratelimit.ShapeVendor})
	}
	e.send(k, "agent", 200, tokens(2))
	for range 5 {
		e.clk.advance(time.Millisecond)
		e.mustAdmit(k, "agent", "/items")
	}
	e.clk.advance(time.Millisecond)
	e.send(k, "agent", 200, tokens(0))
	e.clk.advance(time.Second)
	pe := e.mustPause(k, "agent", "/items")
	if r := pe.Reason; r.Kind != reason.UpstreamSpent || r.Limit != 1000 || r.Unit != "tokens" {
		t.Errorf("pause: got reason %+v, want none of 1000 tokens left", pe.Reason)
	}
}

// A response may show only the policy closest to exhaustion: a policy not
// shown keeps constraining with its last r, and a policy listed only in
// RateLimit-Policy (q and w, no r) constrains through the sliding-window
// log of every send.
func TestSeveralLimitsAtOnce(t *testing.T) {
	t.Run("a policy not shown still holds", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		e.send(k, "agent", 200, reading(0, shown("hour", 1000, time.Hour, 2, 30*time.Minute)))
		e.clk.advance(time.Second)
		// The next answers show only the minute policy, far from exhausted.
		e.send(k, "agent", 200, reading(0, shown("minute", 100, time.Minute, 99, 59*time.Second)))
		e.clk.advance(time.Second)
		e.send(k, "agent", 200, reading(0, shown("minute", 100, time.Minute, 98, 58*time.Second)))
		e.clk.advance(time.Second)
		pe := e.mustPause(k, "agent", "/items")
		if got, want := pe.RetryAfter, 30*time.Minute-3*time.Second; pe.Source != "hour" || got != want {
			t.Errorf("pause: got %s for %v, want 'hour' for %v", pe.Source, got, want)
		}
	})
	t.Run("a policy only listed constrains through the log", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		both := reading(0, shown("minute", 100, time.Minute, 99, time.Minute), listed("hour", 3, time.Hour))
		e.send(k, "agent", 200, both)
		e.clk.advance(10 * time.Second)
		e.send(k, "sync", 200, both)
		e.clk.advance(10 * time.Second)
		e.send(k, "agent", 200, both)
		e.clk.advance(10 * time.Second)
		pe := e.mustPause(k, "sync", "/items")
		if got, want := pe.RetryAfter, time.Hour-30*time.Second; pe.Source != "hour" || got != want {
			t.Errorf("pause: got %s for %v, want 'hour' for %v (until the first send leaves the hour)", pe.Source, got, want)
		}
		e.clk.advance(pe.RetryAfter)
		e.mustAdmit(k, "sync", "/items")
	})
	t.Run("documented policies are shared by every caller and process", func(t *testing.T) {
		e := newEnv(t)
		_, other := e.open()
		k := newKey(policy("default", 2, time.Minute))
		e.send(k, "agent", 200, nil)
		e.clk.advance(20 * time.Second)
		tk, err := e.admitWith(other, e.call(k, "sync", "/b"))
		if err != nil {
			t.Fatal(err)
		}
		answerWith(t, other, e.clk, tk, 200, nil)
		e.clk.advance(20 * time.Second)
		if pe := mustPause(t, e.clk, other, e.call(k, "sync", "/c")); pe.RetryAfter != 20*time.Second {
			t.Errorf("pause: got %v, want 20s (until the first call leaves the minute)", pe.RetryAfter)
		}
	})
}

// Retry-After is the server's decision: nothing goes before it, whatever
// r says, and a later, shorter one does not shorten it.
func TestRetryAfterIsAuthoritative(t *testing.T) {
	e := newEnv(t)
	k := newKey()
	res := e.send(k, "agent", 429, reading(20*time.Second, shown("default", 100, time.Minute, 80, 40*time.Second)))
	// Jitter only adds: 0–10% of the wait, at most 1 s (Rand is 0.5).
	if got, want := res.RetryIn, 20500*time.Millisecond; got != want {
		t.Errorf("Done: got RetryIn %v, want %v", got, want)
	}
	e.clk.advance(time.Second)
	pe := e.mustPause(k, "agent", "/items")
	if got, want := pe.RetryAfter, 19500*time.Millisecond; pe.Source != "retry-after" || got != want {
		t.Errorf("pause: got %s for %v, want retry-after for %v", pe.Source, got, want)
	}
	e.clk.advance(19499 * time.Millisecond)
	e.mustPause(k, "sync", "/items")
	e.clk.advance(time.Millisecond)
	tk := e.mustAdmit(k, "agent", "/items")
	e.clk.advance(300 * time.Millisecond) // slow start after the pause
	tk2 := e.mustAdmit(k, "sync", "/items")

	// A shorter Retry-After does not shorten a longer one.
	e.answer(tk, 503, reading(time.Minute))
	e.answer(tk2, 200, reading(time.Second))
	if pe := e.mustPause(k, "agent", "/items"); pe.RetryAfter < time.Minute {
		t.Errorf("pause: got %v, want at least the minute the first answer asked for", pe.RetryAfter)
	}
}

// When an observation's t runs out it expires: one jittered probe goes,
// every other call waits for its answer, and a timer never refills r.
func TestExpiryLetsOneProbeThrough(t *testing.T) {
	e := newEnv(t)
	_, other := e.open()
	k := newKey()
	e.send(k, "agent", 200, reading(0, shown("default", 120, time.Minute, 0, 10*time.Second)))

	e.clk.advance(10 * time.Second)
	pe := e.mustPause(k, "agent", "/items")
	if pe.RetryAfter <= 0 || pe.RetryAfter >= pacer.ProbeJitter {
		t.Fatalf("at expiry: got a wait of %v, want a jitter in (0, %v)", pe.RetryAfter, pacer.ProbeJitter)
	}
	if pe2 := mustPause(t, e.clk, other, e.call(k, "sync", "/items")); pe2.RetryAfter != pe.RetryAfter {
		t.Errorf("other process: got jitter %v, want the same %v (every process agrees on the probe)", pe2.RetryAfter, pe.RetryAfter)
	}
	e.clk.advance(pe.RetryAfter)
	probe := e.mustAdmit(k, "agent", "/items")
	if !probe.Probe {
		t.Error("the first call after expiry: got an ordinary call, want the probe")
	}
	for _, p := range []*pacer.Pacer{e.p, other} {
		if pe := mustPause(t, e.clk, p, e.call(k, "sync", "/items")); pe.Source != "probe" {
			t.Errorf("while the probe is out: got %s, want to wait for the probe", pe.Source)
		}
	}
	// The probe's answer says the window is still spent: no refill.
	e.clk.advance(300 * time.Millisecond)
	e.answer(probe, 200, reading(0, shown("default", 120, time.Minute, 0, 5*time.Second)))
	if pe := e.mustPause(k, "sync", "/items"); pe.Source != "default" || pe.RetryAfter != 5*time.Second {
		t.Errorf("after a probe that found r=0: got %s for %v, want 'default' for 5s", pe.Source, pe.RetryAfter)
	}
	// Once it expires again, one more probe; its fresh answer opens up.
	e.clk.advance(5*time.Second + pacer.ProbeJitter)
	probe = e.mustAdmit(k, "sync", "/items")
	e.answer(probe, 200, reading(0, shown("default", 120, time.Minute, 119, time.Minute)))
	for range 3 {
		e.clk.advance(time.Second) // slow start after the pause spaces them
		if tk := e.mustAdmit(k, "agent", "/items"); tk.Probe {
			t.Error("after a fresh answer: got another probe, want ordinary calls")
		}
	}
}

// Below the low-water mark calls are spread over what is left instead of
// fired at once; the advice says slow_down, then pause with the seconds.
func TestLowWaterSpreadsCalls(t *testing.T) {
	t.Run("upstream r over what is left of t", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		k.LowWater = 0.1
		res := e.send(k, "agent", 200, reading(0, shown("default", 100, time.Minute, 5, 50*time.Second)))
		if res.Advice.Action != pacer.SlowDown {
			t.Errorf("advice: got %s, want slow_down", res.Advice.Action)
		}
		e.clk.advance(time.Second)
		// 49 s left of a t that may have been rounded up by a second: 48 s
		// for 5 calls, one every 8 s (the last a share before the end).
		pe := e.mustPause(k, "agent", "/items")
		if got, want := pe.RetryAfter, 7*time.Second; got != want {
			t.Errorf("pause: got %v, want %v", got, want)
		}
		e.clk.advance(pe.RetryAfter)
		e.mustAdmit(k, "agent", "/items")
	})
	t.Run("a documented policy at its average pace", func(t *testing.T) {
		e := newEnv(t)
		k := newKey(policy("default", 100, 100*time.Second))
		k.LowWater = 0.1
		for range 90 {
			e.send(k, "sync", 200, nil)
			e.clk.advance(10 * time.Millisecond)
		}
		pe := e.mustPause(k, "sync", "/items")
		if got, want := pe.RetryAfter, time.Second-10*time.Millisecond; got != want || pe.Source != "default" {
			t.Errorf("pause below the mark: got %s for %v, want 'default' for %v", pe.Source, got, want)
		}
		var last pacer.Result
		for range 10 {
			e.clk.advance(time.Second)
			last = e.send(k, "sync", 200, nil)
		}
		// The last call went at 10.9 s; the first leaves the window at 100 s.
		if want := 89100 * time.Millisecond; last.Advice.Action != pacer.Pause || last.Advice.RetryAfter != want {
			t.Errorf("advice when spent: got %s for %v, want pause for %v", last.Advice.Action, last.Advice.RetryAfter, want)
		}
	})
}

// Generous values never raise the pace above the local safety limits: the
// key's maximum rate and concurrency; after a pause the pace rises again
// gradually.
func TestGenerousValuesAreClamped(t *testing.T) {
	generous := func() *ratelimit.Reading {
		return reading(0, shown("default", 1_000_000, time.Second, 1_000_000, time.Second))
	}
	t.Run("maximum rate", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		k.MaxRate = 2
		e.send(k, "agent", 200, generous())
		e.clk.advance(100 * time.Millisecond)
		if pe := e.mustPause(k, "agent", "/items"); pe.Source != "pace" || pe.RetryAfter != 400*time.Millisecond {
			t.Errorf("got %s for %v, want pace for 400ms", pe.Source, pe.RetryAfter)
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		e := newEnv(t)
		_, other := e.open()
		k := newKey()
		k.MaxConcurrency = 2
		e.send(k, "agent", 200, generous())
		e.clk.advance(10 * time.Millisecond)
		e.mustAdmit(k, "agent", "/a")
		e.clk.advance(10 * time.Millisecond)
		e.mustAdmit(k, "agent", "/b")
		e.clk.advance(10 * time.Millisecond)
		if pe := mustPause(t, e.clk, other, e.call(k, "sync", "/c")); pe.Source != "concurrency" {
			t.Errorf("third call in flight: got %s, want concurrency", pe.Source)
		}
	})
	t.Run("slow start after the budget was spent", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		k.MaxRate = 10
		e.send(k, "agent", 200, reading(0, shown("default", 60, time.Minute, 0, 5*time.Second)))
		e.clk.advance(time.Second)
		e.mustPause(k, "agent", "/items") // a pause of the key: the pace will rise gradually after it
		e.clk.advance(4*time.Second + pacer.ProbeJitter)
		probe := e.mustAdmit(k, "agent", "/items")
		e.answer(probe, 200, reading(0, shown("default", 60, time.Minute, 59, time.Minute)))
		var waits []time.Duration
		for range 4 {
			pe := e.mustPause(k, "agent", "/items")
			waits = append(waits, pe.RetryAfter)
			e.clk.advance(pe.RetryAfter)
			e.mustAdmit(k, "agent", "/items")
		}
		// From the average pace of 60 a minute, doubling down to MaxRate.
		want := []time.Duration{500 * time.Millisecond, 250 * time.Millisecond, 125 * time.Millisecond, 100 * time.Millisecond}
		if diff := cmp.Diff(waits, want); diff != "" {
			t.Errorf("spacing after the pause (-got +want):\n%s", diff)
		}
	})
	t.Run("slow start after a pause", func(t *testing.T) {
		e := newEnv(t)
		k := newKey(policy("default", 60, time.Minute)) // an average pace of 1 s
		k.MaxRate = 10
		e.send(k, "agent", 429, reading(30*time.Second))
		e.clk.advance(time.Minute)
		e.send(k, "agent", 200, generous())
		var waits []time.Duration
		for range 5 {
			pe := e.mustPause(k, "agent", "/items")
			waits = append(waits, pe.RetryAfter)
			e.clk.advance(pe.RetryAfter)
			e.send(k, "agent", 200, generous())
		}
		want := []time.Duration{500 * time.Millisecond, 250 * time.Millisecond, 125 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}
		for i := range want {
			if waits[i] != want[i] {
				t.Fatalf("spacing after the pause: got %v, want %v", waits, want)
			}
		}
	})
}

// Without any signal, refusals and failures back off exponentially with
// full jitter above RetryFloor; after BreakerThreshold of them in a row the circuit opens,
// and half-opens with one probe. (A failure with no answer is the key's;
// a server error without a signal is its route's, see
// TestFailingRouteBacksOffItsRouteAlone.)
func TestBackoffAndCircuitBreaker(t *testing.T) {
	e := newEnv(t)
	_, other := e.open()
	k := newKey()
	lost := func() pacer.Result { // no answer: the connection was reset
		t.Helper()
		tk := e.mustAdmit(k, "agent", "/items")
		res, err := e.p.Done(context.Background(), tk, pacer.Outcome{SentAt: tk.AdmittedAt, Err: errors.New("connection reset by peer")})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for n, want := range []time.Duration{1500 * time.Millisecond, 2 * time.Second, 3 * time.Second, 5 * time.Second} {
		res := lost()
		if res.RetryIn != want {
			t.Fatalf("failure %d: got a backoff of %v, want %v", n+1, res.RetryIn, want)
		}
		if pe := e.mustPause(k, "agent", "/items"); pe.Source != "backoff" || pe.RetryAfter != want {
			t.Fatalf("failure %d: got %s for %v, want backoff for %v", n+1, pe.Source, pe.RetryAfter, want)
		}
		e.clk.advance(want)
	}
	res := lost()
	if res.RetryIn != pacer.BreakerCooldown || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0].String(), "circuit") {
		t.Fatalf("fifth failure: got RetryIn %v and warnings %q, want the circuit open for %v", res.RetryIn, res.Warnings, pacer.BreakerCooldown)
	}
	if pe := e.mustPause(k, "agent", "/items"); pe.Source != "circuit" {
		t.Errorf("circuit open: got %s, want circuit", pe.Source)
	}
	// Half open: one probe, and it fails: open again, for twice as long.
	e.clk.advance(pacer.BreakerCooldown)
	probe := e.mustAdmit(k, "agent", "/items")
	if !probe.Probe {
		t.Error("half open: got an ordinary call, want the probe")
	}
	if pe := mustPause(t, e.clk, other, e.call(k, "sync", "/items")); pe.Source != "probe" {
		t.Errorf("half open, probe out: got %s, want to wait for the probe", pe.Source)
	}
	if res := e.answer(probe, 503, nil); res.RetryIn != 2*pacer.BreakerCooldown {
		t.Errorf("failed probe: got RetryIn %v, want the circuit open again for %v", res.RetryIn, 2*pacer.BreakerCooldown)
	}
	// The next probe succeeds: closed, calls flow.
	e.clk.advance(2 * pacer.BreakerCooldown)
	probe = e.mustAdmit(k, "sync", "/items")
	e.answer(probe, 200, nil)
	for range 3 {
		e.clk.advance(10 * time.Millisecond)
		if tk := e.mustAdmit(k, "agent", "/items"); tk.Probe {
			t.Error("closed: got a probe, want ordinary calls")
		}
	}
	// Refusals that say when to come back do not count towards the breaker.
	e.clk.advance(time.Second)
	for range pacer.BreakerThreshold + 1 {
		res := e.send(k, "agent", 429, reading(time.Second, shown("default", 10, time.Second, 0, time.Second)))
		if len(res.Warnings) > 1 || (len(res.Warnings) == 1 && strings.Contains(res.Warnings[0].String(), "circuit")) {
			t.Fatalf("guided refusal: got warnings %q, want no circuit", res.Warnings)
		}
		e.clk.advance(2 * time.Second)
	}
}

// What holds a call is a gate only when a gate closed the key: a policy
// named "circuit" is a budget, and the circuit breaker a gate.
func TestPolicyNamedLikeAGateIsNotOne(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("circuit", 1, time.Minute))
	e.mustAdmit(k, "agent", "/items")
	if pe := e.mustPause(k, "agent", "/items"); pe.Source != "circuit" || pe.Gate != "" {
		t.Errorf("the policy circuit spent: source %q, gate %q; want source circuit and no gate", pe.Source, pe.Gate)
	}
	e.clk.advance(time.Minute)
	if err := e.db.Update(context.Background(), func(tx ledger.Tx) error {
		return tx.PutGate(ledger.Gate{Key: k.Name, Until: e.clk.Now().Add(time.Hour), Source: ledger.CircuitGate,
			Reason: reason.Reason{Kind: reason.CircuitOpen, Key: k.Name, Failures: 5, For: time.Hour}, SetAt: e.clk.Now()})
	}, k.Name); err != nil {
		t.Fatal(err)
	}
	if pe := e.mustPause(k, "agent", "/items"); pe.Source != "circuit" || pe.Gate != ledger.CircuitGate {
		t.Errorf("the circuit breaker open: source %q, gate %q; want circuit, the circuit breaker's gate", pe.Source, pe.Gate)
	}
}

// What holds a call is one of the pacer's own limits only when that limit
// binds: a policy named "pace" or "concurrency" is a budget, and the
// key's pace and its most calls at once are the pacer's.
func TestPolicyNamedLikeALimitIsNotOne(t *testing.T) {
	for _, name := range []string{"pace", "concurrency"} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			k := newKey(policy(name, 1, time.Minute))
			e.mustAdmit(k, "agent", "/items")
			if pe := e.mustPause(k, "agent", "/items"); pe.Source != name || pe.Limit != "" || pe.Binding == nil {
				t.Errorf("the policy %s spent: source %q, limit %q, binding %v; want source %s, no limit, its budget",
					name, pe.Source, pe.Limit, pe.Binding, name)
			}
		})
	}
	t.Run("the pacer's pace", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		k.MaxRate = 2
		e.mustAdmit(k, "agent", "/items")
		if pe := e.mustPause(k, "agent", "/items"); pe.Limit != pacer.PaceLimit {
			t.Errorf("got limit %q, want %q", pe.Limit, pacer.PaceLimit)
		}
	})
	t.Run("the pacer's concurrency", func(t *testing.T) {
		e := newEnv(t)
		k := newKey()
		k.MaxConcurrency = 1
		e.mustAdmit(k, "agent", "/a")
		e.clk.advance(time.Second)
		_, other := e.open()
		if pe := mustPause(t, e.clk, other, e.call(k, "sync", "/b")); pe.Limit != pacer.ConcurrencyLimit {
			t.Errorf("got limit %q, want %q", pe.Limit, pacer.ConcurrencyLimit)
		}
	})
}

// The errors Admit returns.
func TestPauseError(t *testing.T) {
	e := newEnv(t)
	k := newKey(policy("default", 1, time.Minute))
	e.mustAdmit(k, "agent", "/items")
	pe := e.mustPause(k, "agent", "/items")
	if !errors.Is(pe, pacer.ErrPaused) {
		t.Error("errors.Is(*PauseError, ErrPaused) = false, want true")
	}
	if got, want := pe.Error(), "key k paused for 60 s: all 1 calls per 60 s allowed by policy 'default' are used"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if pe.Binding == nil || pe.Binding.Policy != "default" || pe.Binding.Remaining != 0 {
		t.Errorf("Binding = %+v, want policy 'default' with nothing left", pe.Binding)
	}
}
