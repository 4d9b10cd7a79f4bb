package pacer

import (
	"net/http"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The outcome's rules. Each returns its part of the plan (see
// outcomePlan) from the answer and, for some, what it reads in the
// transaction; none writes. record runs them in this order, applying
// each part before the next rule reads: observe (answer.go), retryAfter,
// abnormal, hiddenLimit (hidden.go), bound (bound.go), routeFailure
// (failRoute in routefail.go), breaker, close.

// record is Done's work in tx: it reads what the answer o to t's attempt
// is weighed against, runs the outcome's rules in order, applying each
// one's part of the plan, and returns the whole. It changes nothing in
// memory.
func (p *Pacer) record(tx ledger.Tx, t Ticket, o Outcome) (outcomePlan, error) {
	a, err := readAnswer(tx, t, o, p.now())
	if err != nil {
		return outcomePlan{}, err
	}
	r := &recorder{tx: tx, plan: outcomePlan{res: Result{State: classify(o, a.rd)}}}
	if err := p.recordSignals(r, a); err != nil {
		return r.plan, err
	}
	part, routeOnly, err := a.routeFailure(tx, p.rand)
	if err := r.applyPart(part, err); err != nil {
		return r.plan, err
	}
	part, ks := a.breaker(routeOnly, p.rand)
	if err := r.applyPart(part, nil); err != nil {
		return r.plan, err
	}
	return r.plan, r.applyPart(a.close(ks), nil)
}

// recordSignals runs the rules of what the answer said: its
// observations, its Retry-After, an abnormal-usage problem, and the limits
// it revealed (a hidden one, one policy too many).
func (p *Pacer) recordSignals(r *recorder, a *answer) error {
	if err := r.applyPart(a.observe(r.tx)); err != nil {
		return err
	}
	if err := r.applyPart(a.retryAfter(p.rand), nil); err != nil {
		return err
	}
	if err := r.applyPart(a.abnormal(), nil); err != nil {
		return err
	}
	grew := a.grew
	if a.hidesLimit() {
		part, err := a.hiddenLimit(r.tx, p.inFlightTimeout())
		if err := r.applyPart(part, err); err != nil {
			return err
		}
		grew = grew || len(part.res.Warnings) > 0
	}
	if k := a.t.Call.Key; grew && full(k, a.priorPolicies) {
		return r.applyPart(bound(r.tx, k, a.now, maxTime(a.ks.LastResponseAt, a.now)))
	}
	return nil
}

// retryAfter gates the key until the answer's Retry-After. It is the
// server's decision: nothing goes before it. Jitter (from rand) only adds,
// so callers released together do not return together. A wait that holds
// for the request's route alone (Slack's per-method tiers) is kept by that
// route's exhausted policy instead of a gate on the whole key.
func (a *answer) retryAfter(rand func() float64) outcomePlan {
	rd, now := a.rd, a.now
	var part outcomePlan
	if !rd.HasRetryAfter {
		return part
	}
	until := now.Add(rd.RetryAfter)
	until = until.Add(time.Duration(rand() * 0.1 * float64(min(rd.RetryAfter, 10*time.Second))))
	if !rd.RetryAfterPerRoute {
		part.gates = []ledger.Gate{{Key: a.t.Call.Key.Name, Until: until, Source: ledger.RetryAfterGate, SetAt: now,
			Reason: reason.Reason{Kind: reason.RetryAfterAsked, Status: a.o.Status, For: rd.RetryAfter}}}
	}
	part.res.RetryIn = until.Sub(now)
	return part
}

// abnormal pauses the key when the upstream reported abnormal usage, and
// passes on an answer's request not to retry.
func (a *answer) abnormal() outcomePlan {
	rd, now, key := a.rd, a.now, a.t.Call.Key.Name
	var part outcomePlan
	if rd.Abnormal {
		until := now.Add(max(rd.RetryAfter, AbnormalPause))
		msg := reason.Reason{Kind: reason.Abnormal, Key: key, Violated: violated(rd.Problem), Until: until}
		part.gates = []ledger.Gate{{Key: key, Until: until, Source: ledger.AbnormalUsageGate, SetAt: now, Reason: msg}}
		part.warnings = []ledger.Warning{{Key: key, At: now, Kind: ledger.AbnormalUsageWarning, Reason: msg}}
		part.res.Warnings = []reason.Reason{msg}
	}
	part.res.DoNotRetry = rd.Abnormal || rd.DoNotRetry
	return part
}

// hidesLimit reports a refusal nothing the answer shows explains: it may
// reveal a limit nobody announced (see hiddenLimit). A secondary limit's
// refusal is its wait alone.
func (a *answer) hidesLimit() bool {
	refused := a.rd.Throttled || a.o.Status == http.StatusTooManyRequests
	return refused && !a.exhausted && !a.rd.Abnormal && !a.rd.Secondary
}

// routeFailure backs off the request's route alone when the failure is
// evidence about that route only (see failRoute); it says whether it was.
func (a *answer) routeFailure(v outcomeView, rand func() float64) (outcomePlan, bool, error) {
	if !a.failure || a.guided || (a.probe && a.ks.HalfOpen) || !routeEvidence(a.o, a.rd) {
		return outcomePlan{}, false, nil
	}
	return failRoute(v, a.t, a.o, a.now, rand)
}

// breaker counts a failure without guidance towards the circuit breaker,
// and backs off or opens the circuit; a success closes it. It returns the
// key's pacing state as it leaves it, routeOnly saying the failure was
// its route's alone.
func (a *answer) breaker(routeOnly bool, rand func() float64) (outcomePlan, ledger.KeyState) {
	ks := a.ks
	var part outcomePlan
	switch {
	case routeOnly:
		// Backed off on its route alone: the key goes on as it was.
	case a.failure && !a.guided && !a.rd.Abnormal:
		ks.Failures++
		if reopen := a.probe && ks.HalfOpen; ks.Failures >= BreakerThreshold || reopen {
			part = a.openCircuit(&ks, reopen)
		} else {
			part = a.backOff(ks, rand())
		}
		ks.Interval = max(ks.Interval, slowStart(a.t.Call.Key, nil))
	case a.failure:
		ks.Interval = max(ks.Interval, slowStart(a.t.Call.Key, nil))
	case a.o.CallerAbort && a.o.Status == 0:
		// No answer, and the upstream is not to blame: nothing learned.
	default:
		ks.Failures, ks.Opens, ks.HalfOpen = 0, 0, false
	}
	return part, ks
}

// openCircuit opens (or, when the half-open probe failed, reopens) the
// circuit of ks's key: nothing goes until the cooldown ends, then one
// probe.
func (a *answer) openCircuit(ks *ledger.KeyState, reopen bool) outcomePlan {
	key, now := a.t.Call.Key.Name, a.now
	cool := cooldown(ks.Opens)
	ks.Opens++
	ks.HalfOpen = true
	ks.Failures = 0
	why := reason.Reason{Kind: reason.CircuitOpen, Key: key, Failures: BreakerThreshold, For: cool}
	if reopen {
		why.Kind = reason.CircuitReopen
	}
	return outcomePlan{
		gates:    []ledger.Gate{{Key: key, Until: now.Add(cool), Source: ledger.CircuitGate, SetAt: now, Reason: why}},
		warnings: []ledger.Warning{{Key: key, At: now, Kind: ledger.CircuitOpenWarning, Reason: why}},
		res:      Result{Warnings: []reason.Reason{why}, RetryIn: cool},
	}
}

// backOff gates the key for the backoff of its latest failure in a row,
// ks.Failures, jittered by r (uniform in [0, 1)).
func (a *answer) backOff(ks ledger.KeyState, r float64) outcomePlan {
	d := backoff(ks.Failures, r)
	why := reason.Reason{Kind: reason.BackOff, Status: a.o.Status, Failures: int64(ks.Failures), Short: a.short}
	if a.short {
		why.For = serverWait(a.rd)
	}
	return outcomePlan{
		gates: []ledger.Gate{{Key: a.t.Call.Key.Name, Until: a.now.Add(d), Source: ledger.BackoffGate, SetAt: a.now, Reason: why}},
		res:   Result{RetryIn: d},
	}
}

// close ends the probe t was, and returns the key's pacing state ks to
// write and t's attempt's end.
func (a *answer) close(ks ledger.KeyState) outcomePlan {
	if a.probe {
		ks.ProbeAttempt, ks.ProbeUntil = 0, time.Time{}
	}
	if a.o.Status > 0 {
		ks.LastResponseAt = a.now
	}
	f := finishing{attempt: finished(a.t, a.o, classify(a.o, a.rd)), slot: a.t.Leased()}
	return outcomePlan{keyState: &ks, finish: &f}
}

// backoff is the wait after the n-th refusal or failure in a row without
// guidance: RetryFloor, plus full jitter (r, uniform in [0, 1)) over a
// span that starts at BackoffBase and doubles with each failure, all of it
// capped at BackoffCap. The first is thus never a near-immediate resend
// (1 to 2 s), and the span keeps clients that failed together apart.
func backoff(n int, r float64) time.Duration {
	d := min(BackoffCap, BackoffBase<<min(max(n, 1)-1, 16))
	return min(BackoffCap, RetryFloor+time.Duration(r*float64(d)))
}
