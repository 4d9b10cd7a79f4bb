package pacer

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// Backoff and circuit-breaker settings, used when an upstream refuses or
// fails without saying when to come back.
const (
	// RetryFloor is the least a refusal holds a key back. A server's own
	// wait shorter than this (Retry-After: 0, an HTTP-date in the past,
	// r=0;t=0) is no guidance: such a refusal backs off like one that
	// said nothing, so a server that keeps answering that way meets
	// exponential backoff and the circuit breaker, never a tight loop.
	RetryFloor       = time.Second
	BackoffBase      = time.Second      // the jitter's span after the first failure, on top of RetryFloor; it doubles with each failure…
	BackoffCap       = time.Minute      // …and the whole backoff stays under this
	BreakerThreshold = 5                // consecutive refusals or failures without guidance
	BreakerCooldown  = 30 * time.Second // doubles with every reopening…
	BreakerMax       = 10 * time.Minute // …up to this
	// AbnormalPause is the least an "abnormal usage" answer pauses a key.
	AbnormalPause = 15 * time.Minute
)

// An Outcome is how an admitted attempt ended. The zero Outcome is an
// attempt that was never sent.
type Outcome struct {
	SentAt     time.Time          // when the request left; later sends are subtracted from what its answer says
	AnsweredAt time.Time          // zero when no answer came
	Status     int                // 0 when no answer came
	Err        error              // the transport error, when no answer came
	Reading    *ratelimit.Reading // the answer's rate-limit signals; nil when none were read
	// CallerAbort says the attempt failed on the caller's side (its body
	// was too large, it went away): the upstream is not to blame, so no
	// backoff and no count towards the circuit breaker.
	CallerAbort bool
}

// Advice tells a caller what to do next. The zero Advice says nothing.
type Advice struct {
	Action     Action        // continue, slow_down or pause
	RetryAfter time.Duration // for Pause: come back after this long
	Reason     string        // one plain sentence the caller can act on
}

// A Result is what Done learned: the key's budgets after the answer, the
// tightest of them, what to do next, and warnings raised by the answer.
type Result struct {
	State      string        // the attempt's final state
	Budgets    []Budget      // every budget of the key, as the caller would meet it next
	Binding    *Budget       // the tightest of them; nil when none is known
	Advice     Advice        // what the caller should do next
	Warnings   []string      // new: hidden limit, abnormal usage, circuit open
	DoNotRetry bool          // the answer says not to retry, or retrying cannot help
	RetryIn    time.Duration // the least wait before a retry the answer set (Retry-After, backoff, circuit)
}

// Done records how t's attempt ended: its state, every observation its
// answer carried, the gates its signals set (Retry-After, backoff, an open
// circuit, an abnormal-usage pause), hidden limits it revealed, and the
// end of a probe. It returns the quota that now holds and the advice.
func (p *Pacer) Done(ctx context.Context, t Ticket, o Outcome) (Result, error) {
	defer p.signal(t.Call.Key.Name)
	if res, ok := p.foreseen(t, o); ok {
		// Only the call and its answer's observations are recorded now,
		// through the process's journal (see state.FinishLater); what they
		// teach waits for the key's next transaction (see learned).
		fin := ledger.Finished{Attempt: finished(t, o, res.State), Observations: observations(t, o)}
		if err := p.db.FinishLater(ctx, fin); err != nil {
			return res, fmt.Errorf("pacer: record %s: %w", t.Call.Key.Name, err)
		}
		p.learn(t, o)
		return res, nil
	}
	var res Result
	// A lease this answer ends stops handing out slots at once, in memory,
	// and its slots are given back by the transaction: by every run of it,
	// since the function may run more than once (see ledger.Store).
	var ended *lease
	// An outcome that failed before is kept for the key's next
	// transaction, which may have recorded it already (see unrecorded.go).
	retried := p.dropUnrecorded(t)
	record := func(tx ledger.Tx) (Result, error) {
		res, ks, err := p.recordOnce(tx, t, o, retried)
		if err != nil {
			return res, err
		}
		if t.lease != nil {
			if r, ok := p.leaseResult(t, o, res, p.now()); ok {
				return r, nil
			}
			ended = cmp.Or(ended, p.breakLease(t.lease))
		} else if unforeseen(o, res) {
			// Whatever call brought it, the key's lease does not foresee it.
			ended = cmp.Or(ended, p.breakLease(p.currentLease(t.Call.Key.Name)))
		}
		res.Budgets, res.Binding, res.Advice, err = p.advise(tx, t.Call, p.now(), ks)
		return res, err
	}
	err := p.update(ctx, func(tx ledger.Tx) error {
		var err error
		if res, err = record(tx); err != nil {
			return err
		}
		if ended != nil {
			return ended.release(tx)
		}
		return nil
	}, t.Call.Key.Name)
	if err != nil {
		p.keepUnrecorded(t, o, err)
		return res, fmt.Errorf("pacer: record %s: %w", t.Call.Key.Name, err)
	}
	return res, nil
}

// foreseen returns what Done tells the caller of t when t came from a
// lease, not broken, that foresaw the answer o (see leaseResult), or was
// admitted with budgets that foresaw it (see quickResult).
func (p *Pacer) foreseen(t Ticket, o Outcome) (Result, bool) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return Result{}, false // nothing would write what it teaches
	}
	if t.lease == nil {
		return p.quickResult(t, o)
	}
	rd := o.Reading
	if rd == nil {
		rd = &ratelimit.Reading{}
	}
	return p.leaseResult(t, o, Result{State: classify(o, rd)}, p.now())
}

// observations are the observations of the answer to t, with their
// context, as recorded.
func observations(t Ticket, o Outcome) []ledger.ObservationRecord {
	rd := o.Reading
	if rd == nil {
		return nil
	}
	c := t.Call
	obs := make([]ledger.ObservationRecord, len(rd.Observations))
	for i, ob := range rd.Observations {
		if ob.PerRoute && ob.Partition == "" {
			ob.Partition = routePartition(c.route())
		}
		obs[i] = ledger.ObservationRecord{Key: c.Key.Name, AttemptID: t.ID, Observation: normalized(ob),
			Status: o.Status, ReceivedAt: rd.ReceivedAt, ServerDate: rd.ServerDate, FromCache: rd.FromCache,
			Method: c.Method, Target: c.Target}
	}
	return obs
}

// normalized names the policy and unit of an observation that did not,
// and renames one that takes the name of the policy evicted ones are
// folded into (see bound), which only mcp-quota writes.
func normalized(ob ratelimit.Observation) ratelimit.Observation {
	switch ob.Policy {
	case "":
		ob.Policy = unnamedPolicy
	case EvictedPolicy:
		ob.Policy = "upstream-" + EvictedPolicy
	}
	ob.Policy, ob.Partition = boundName(ob.Policy), boundName(ob.Partition)
	if ob.Unit == "" {
		ob.Unit = ratelimit.Requests
	}
	return ob
}

// finished is t's attempt as it ended with o, in state st.
func finished(t Ticket, o Outcome, st string) ledger.Attempt {
	reason := ""
	switch {
	case o.Err != nil:
		reason = o.Err.Error()
	case o.Status > 0:
		reason = fmt.Sprintf("HTTP %d %s", o.Status, http.StatusText(o.Status))
	}
	c := t.Call
	return ledger.Attempt{ID: t.ID, Key: c.Key.Name, CallID: c.CallID, Attempt: c.Attempt, Caller: c.Caller,
		Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest, State: st, Reason: reason,
		Status: o.Status, SentAt: o.SentAt, AnsweredAt: o.AnsweredAt}
}

// finish records how t's attempt ended: in state st.
func finish(tx ledger.Tx, t Ticket, o Outcome, st string) error {
	a := finished(t, o, st)
	if t.Leased() {
		return tx.FinishReserved(a)
	}
	return tx.FinishAttempt(a.ID, a.State, a.Reason, a.Status, a.SentAt, a.AnsweredAt)
}

// record is Done's work in tx: it returns what was learnt and the key's
// pacing state as recorded.
func (p *Pacer) record(tx ledger.Tx, t Ticket, o Outcome) (Result, ledger.KeyState, error) {
	c := t.Call
	key := c.Key.Name
	now := o.AnsweredAt
	if now.IsZero() {
		now = p.now()
	}
	basis := o.SentAt // later sends are subtracted from what the answer says
	if basis.IsZero() {
		basis = t.AdmittedAt
	}
	if t.Leased() || t.granted {
		// The lease's slots are all recorded at its grant, whenever they
		// go: the answer to one of them, or to the call whose admission
		// granted them, is taken to precede every one of them, lest one
		// sent after it go uncounted.
		basis = t.AdmittedAt.Add(-time.Microsecond)
	}
	ks, err := tx.KeyState(key)
	if err != nil {
		return Result{}, ks, err
	}
	rd := o.Reading
	if rd == nil {
		rd = &ratelimit.Reading{ReceivedAt: now}
	}
	res := Result{State: classify(o, rd)}
	known, err := tx.Known(key)
	if err != nil {
		return res, ks, err
	}
	// How long after its admission this call was answered: a send may
	// reach the upstream that long after it is admitted (see margin).
	switch {
	case !o.AnsweredAt.IsZero():
		noteLatency(&ks, o.AnsweredAt.Sub(t.AdmittedAt), now, latencyPeriod(c.Key, known))
	case o.Err != nil && !o.CallerAbort:
		noteLatency(&ks, now.Sub(t.AdmittedAt), now, latencyPeriod(c.Key, known))
	}
	// Every observation is kept with its context; fresh ones become the
	// latest word on their policy.
	exhausted := false
	grew := false // a policy not kept before was recorded
	for _, rec := range observations(t, o) {
		if err := tx.AddObservation(rec); err != nil {
			return res, ks, err
		}
		ob := rec.Observation
		if ob.HasRemaining && ob.Remaining <= 0 {
			exhausted = true
		}
		if rd.FromCache {
			continue
		}
		var prev *ledger.Known
		for i, k := range known {
			if k.Policy == ob.Policy && k.Unit == ob.Unit && k.Partition == ob.Partition {
				prev = &known[i]
			}
		}
		grew = grew || prev == nil
		if ob, err = learnLeak(tx, key, ob, rd.ReceivedAt, basis, o.Status, prev); err != nil {
			return res, ks, err
		}
		if ob, err = settle(tx, c.Key, ob, rd.ReceivedAt, t.AdmittedAt, basis, prev, ks); err != nil {
			return res, ks, err
		}
		if err := tx.PutKnown(ledger.Known{Key: key, Observation: ob, ReceivedAt: rd.ReceivedAt, BasisAt: basis,
			Route: c.route()}); err != nil {
			return res, ks, err
		}
	}

	guided := rd.HasRetryAfter || exhausted
	failure := rd.Throttled || o.Status == http.StatusTooManyRequests || serverTrouble(o.Status) || (o.Err != nil && !o.CallerAbort)
	// A refusal whose own wait is shorter than RetryFloor is no guidance:
	// it backs off, and counts towards the circuit breaker.
	short := failure && guided && serverWait(rd) < RetryFloor
	if short {
		guided = false
	}

	// Retry-After is the server's decision: nothing goes before it. Jitter
	// only adds, so callers released together do not return together. A
	// wait that holds for the request's route alone (Slack's per-method
	// tiers) is kept by that route's exhausted policy instead of a gate on
	// the whole key.
	if rd.HasRetryAfter {
		until := now.Add(rd.RetryAfter)
		until = until.Add(time.Duration(p.rand() * 0.1 * float64(min(rd.RetryAfter, 10*time.Second))))
		if !rd.RetryAfterPerRoute {
			if err := tx.PutGate(ledger.Gate{Key: key, Until: until, Source: "retry-after", SetAt: now,
				Reason: fmt.Sprintf("the upstream answered %d and asked to wait %s (Retry-After)", o.Status, seconds(rd.RetryAfter))}); err != nil {
				return res, ks, err
			}
		}
		res.RetryIn = until.Sub(now)
	}

	if rd.Abnormal {
		until := now.Add(max(rd.RetryAfter, AbnormalPause))
		msg := fmt.Sprintf("the upstream reported abnormal usage of key '%s'%s; calls are paused until %s — check what is calling it before resuming",
			key, violated(rd.Problem), until.UTC().Format(time.RFC3339))
		if err := tx.PutGate(ledger.Gate{Key: key, Until: until, Source: "abnormal-usage", SetAt: now, Reason: msg}); err != nil {
			return res, ks, err
		}
		if err := tx.AddWarning(ledger.Warning{Key: key, At: now, Kind: "abnormal-usage", Message: msg}); err != nil {
			return res, ks, err
		}
		res.Warnings = append(res.Warnings, msg)
		res.DoNotRetry = true
	}
	if rd.DoNotRetry {
		res.DoNotRetry = true
	}

	refused := rd.Throttled || o.Status == http.StatusTooManyRequests
	if refused && !exhausted && !rd.Abnormal && !rd.Secondary { // a secondary limit is its wait alone
		// Nothing we saw explains the refusal: a limit nobody announced.
		msg, err := p.hiddenLimit(tx, t, rd, now)
		if err != nil {
			return res, ks, err
		}
		if msg != "" {
			res.Warnings = append(res.Warnings, msg)
			grew = true
		}
	}
	if grew && full(c.Key, known) {
		if msg, err := bound(tx, c.Key, now, maxTime(ks.LastResponseAt, now)); err != nil {
			return res, ks, err
		} else if msg != "" {
			res.Warnings = append(res.Warnings, msg)
		}
	}

	probe := ks.ProbeAttempt == t.ID
	routeOnly := false // the failure is evidence about its route alone
	if failure && !guided && !(probe && ks.HalfOpen) && routeEvidence(o, rd) {
		var wait time.Duration
		var msg string
		if routeOnly, wait, msg, err = p.failRoute(tx, t, o, rd, now); err != nil {
			return res, ks, err
		}
		res.RetryIn = max(res.RetryIn, wait)
		if msg != "" {
			res.Warnings = append(res.Warnings, msg)
		}
	}
	switch {
	case routeOnly:
		// Backed off on its route alone: the key goes on as it was.
	case failure && !guided && !rd.Abnormal:
		ks.Failures++
		reopen := probe && ks.HalfOpen
		if ks.Failures >= BreakerThreshold || reopen {
			// Open (or, when the half-open probe failed, reopen) the circuit:
			// nothing goes until the cooldown ends, then one probe.
			cool := cooldown(ks.Opens)
			ks.Opens++
			ks.HalfOpen = true
			ks.Failures = 0
			msg := fmt.Sprintf("the circuit for key '%s' opened after %d refusals or failures without guidance, and one probe goes in %s",
				key, BreakerThreshold, seconds(cool))
			if reopen {
				msg = fmt.Sprintf("the circuit for key '%s' opened again because its probe failed too, and the next probe goes in %s",
					key, seconds(cool))
			}
			if err := tx.PutGate(ledger.Gate{Key: key, Until: now.Add(cool), Source: "circuit", SetAt: now, Reason: msg}); err != nil {
				return res, ks, err
			}
			if err := tx.AddWarning(ledger.Warning{Key: key, At: now, Kind: "circuit-open", Message: msg}); err != nil {
				return res, ks, err
			}
			res.Warnings = append(res.Warnings, msg)
			res.RetryIn = max(res.RetryIn, cool)
		} else {
			d := backoff(ks.Failures, p.rand())
			why := "without saying when to come back"
			if short {
				why = fmt.Sprintf("and asked to wait only %s, too short to trust", seconds(serverWait(rd)))
			}
			if err := tx.PutGate(ledger.Gate{Key: key, Until: now.Add(d), Source: "backoff", SetAt: now,
				Reason: fmt.Sprintf("the upstream answered %s %s, so calls back off (failure %d in a row)",
					statusWord(o), why, ks.Failures)}); err != nil {
				return res, ks, err
			}
			res.RetryIn = max(res.RetryIn, d)
		}
		ks.Interval = max(ks.Interval, slowStart(c.Key, nil))
	case failure:
		ks.Interval = max(ks.Interval, slowStart(c.Key, nil))
	case o.CallerAbort && o.Status == 0:
		// No answer, and the upstream is not to blame: nothing learned.
	default:
		ks.Failures, ks.Opens, ks.HalfOpen = 0, 0, false
	}
	if probe {
		ks.ProbeAttempt, ks.ProbeUntil = 0, time.Time{}
	}
	if o.Status > 0 {
		ks.LastResponseAt = now
	}
	if err := tx.PutKeyState(ks); err != nil {
		return res, ks, err
	}
	return res, ks, finish(tx, t, o, res.State)
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

// serverWait is the wait an answer sets by itself: its Retry-After, or
// how long a policy it shows exhausted stays so (its t, else its w, else
// DefaultValidity), whichever is longest; 0 when it sets none.
func serverWait(rd *ratelimit.Reading) time.Duration {
	var d time.Duration
	if rd.HasRetryAfter {
		d = rd.RetryAfter
	}
	for _, ob := range rd.Observations {
		if !ob.HasRemaining || ob.Remaining > 0 {
			continue
		}
		switch {
		case ob.HasReset:
			d = max(d, ob.Reset)
		case ob.Window > 0:
			d = max(d, ob.Window)
		default:
			d = max(d, DefaultValidity)
		}
	}
	return d
}

// routePartition is the partition of a PerRoute observation of a request
// on route: it constrains that route alone (see applicable).
func routePartition(route string) string { return "route " + route }

// unnamedPolicy names observations whose upstream named no policy.
const unnamedPolicy = "x-ratelimit"

// classify turns an outcome into an attempt state.
func classify(o Outcome, rd *ratelimit.Reading) string {
	switch {
	case o.Status == 0:
		return ledger.Failed
	case rd.Throttled || o.Status == http.StatusTooManyRequests:
		return ledger.RejectedUpstream
	case o.Status == http.StatusAccepted:
		return ledger.Accepted
	case o.Status < 400:
		return ledger.Confirmed
	case o.Status < 500:
		return ledger.RejectedUpstream
	}
	return ledger.Failed
}

// serverTrouble reports statuses that say the server could not serve now.
func serverTrouble(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout || status == http.StatusInternalServerError
}

func statusWord(o Outcome) string {
	if o.Status == 0 {
		return "nothing (the request failed)"
	}
	return fmt.Sprint(o.Status)
}

func violated(pr *ratelimit.Problem) string {
	if pr == nil || len(pr.ViolatedPolicies) == 0 {
		return ""
	}
	return fmt.Sprintf(" (violated policies: %v)", pr.ViolatedPolicies)
}
