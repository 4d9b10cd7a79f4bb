package pacer

import (
	"math"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A server error that says nothing of rate limits is evidence about the
// route it answered (method and path), not about the key: it backs off
// and, after BreakerThreshold of them, opens the circuit of that route
// alone — other routes of the key go on. When such failures spread (they
// come from PathSpread routes or more within PathWindow, as an overloaded
// upstream's do), each is the key's: it backs off the whole key and counts
// towards the key's circuit. A refusal (429), Retry-After, a rate-limit
// signal, an abnormal-usage problem and a failure with no answer at all
// are always the key's. A failure that is the key's is not kept per
// route: the store keeps at most PathSpread-1 routes' failures per
// PathWindow, forgotten after pathMemory.
const (
	// PathSpread is how many routes failing within PathWindow make a
	// failure the key's.
	PathSpread = 3
	// PathWindow is how long a route's failure counts: for its own
	// backoff and circuit, and for the spread.
	PathWindow = time.Minute
	// pathMemory is how long a route's failures are kept: its circuit's
	// longest cooldown, and a window after it.
	pathMemory = BreakerMax + PathWindow
)

// routeEvidence reports whether the failed answer o, read as rd, is
// evidence about its route alone: a server error (500, 502, 503, 504)
// with no rate-limit signal of any kind.
func routeEvidence(o Outcome, rd *ratelimit.Reading) bool {
	return o.Err == nil && serverTrouble(o.Status) && !rd.Throttled && !rd.HasRetryAfter && !rd.Abnormal &&
		len(rd.Observations) == 0 && rd.Problem == nil && !rd.DoNotRetry
}

// widens reports whether a failure is the key's, failing being how many of
// its routes failed within PathWindow, its own included.
func widens(failing int) bool { return failing >= PathSpread }

// cooldown is how long a circuit stays open after it opened opens times
// before in a row.
func cooldown(opens int) time.Duration {
	return min(time.Duration(float64(BreakerCooldown)*math.Pow(2, float64(opens))), BreakerMax)
}

// routeFailure is one more failure of a route whose state was ps, at now,
// r being a uniform jitter in [0, 1): the route's new state, how long the
// route waits, and whether its circuit opened. Failures older than
// PathWindow are not counted; a failure within PathWindow after the
// route's circuit closed opens it again, for twice as long.
func routeFailure(ps ledger.PathState, now time.Time, r float64) (ledger.PathState, time.Duration, bool) {
	since := now.Sub(ps.LastAt)
	if ps.HalfOpen && since > cooldown(ps.Opens-1)+PathWindow {
		ps.HalfOpen = false
	}
	if since > pathMemory {
		ps.Opens = 0
	}
	if since > PathWindow {
		ps.Failures = 0
	}
	ps.Failures++
	ps.LastAt = now
	if ps.Failures >= BreakerThreshold || ps.HalfOpen {
		cool := cooldown(ps.Opens)
		ps.Opens++
		ps.HalfOpen = true
		ps.Failures = 0
		return ps, cool, true
	}
	return ps, backoff(ps.Failures, r), false
}

// failRoute plans the failure of t's route at now, when o is evidence
// about that route alone, and says whether it stays the route's (else it
// is the key's: its failures spread). The part it returns forgets old
// route failures, records the route's, gates the route (backoff, or its
// circuit with a warning) and sets the wait; rand gives the backoff's
// jitter.
func failRoute(v outcomeView, t Ticket, o Outcome, now time.Time, rand func() float64) (outcomePlan, bool, error) {
	c := t.Call
	key, route := c.Key.Name, c.route()
	scope := routePartition(route)
	// Failures older than pathMemory are forgotten, whatever this one is.
	forget := now.Add(-pathMemory)
	part := outcomePlan{forget: &pathsBefore{key: key, before: forget}}
	failing, err := v.FailingPaths(key, now.Add(-PathWindow))
	if err != nil {
		return outcomePlan{}, false, err
	}
	ps, err := v.PathState(key, scope)
	if err != nil {
		return outcomePlan{}, false, err
	}
	if forgottenBy(ps.LastAt, forget) {
		ps = ledger.PathState{Key: key, Scope: scope} // forgotten by this plan
	}
	if ps.LastAt.IsZero() || now.Sub(ps.LastAt) > PathWindow {
		failing++ // this route is one more
	}
	if widens(failing) {
		// The key's failure: it is not kept per route, so that the routes
		// kept stay a few, whatever fails.
		return part, false, nil
	}
	ps, wait, opened := routeFailure(ps, now, rand())
	g := ledger.Gate{Key: key, Scope: scope, Until: now.Add(wait), Source: ledger.BackoffGate, SetAt: now,
		Reason: reason.Reason{Kind: reason.RouteBackOff, Status: o.Status, Route: route, Failures: int64(ps.Failures), Window: PathWindow}}
	part.path, part.res.RetryIn = &ps, wait
	if opened {
		g.Source = ledger.CircuitGate
		g.Reason = reason.Reason{Kind: reason.RouteCircuit, Route: route, Key: key, For: wait}
		part = raise(part, key, now, ledger.CircuitOpenWarning, g.Reason)
	}
	part.gates = []ledger.Gate{g}
	return part, true, nil
}

// forgottenBy says whether ForgetPaths(key, before) forgets a route whose
// latest failure was at last, so that a plan weighs the route as the
// store will have left it. It is the store's rule, copied: see
// ledger.Tx.ForgetPaths (a latest failure before before) and the
// stores, which keep times to the microsecond (state's micros).
func forgottenBy(last, before time.Time) bool {
	return last.Before(before.Truncate(time.Microsecond))
}
