package pacer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
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
	Why        reason.Reason // why, or what is left (reason.Advice words it)
}

// A Result is what Done learned: the key's budgets after the answer, the
// tightest of them, what to do next, and warnings raised by the answer.
type Result struct {
	State      ledger.State    // the attempt's final state
	Budgets    []Budget        // every budget of the key, as the caller would meet it next
	Binding    *Budget         // the tightest of them; nil when none is known
	Advice     Advice          // what the caller should do next
	Warnings   []reason.Reason // new: hidden limit, abnormal usage, circuit open
	DoNotRetry bool            // the answer says not to retry, or retrying cannot help
	RetryIn    time.Duration   // the least wait before a retry the answer set (Retry-After, backoff, circuit)
}

// Done records how t's attempt ended: its state, every observation its
// answer carried, the gates its signals set (Retry-After, backoff, an open
// circuit, an abnormal-usage pause), hidden limits it revealed, and the
// end of a probe. It returns the quota that now holds and the advice.
func (p *Pacer) Done(ctx context.Context, t Ticket, o Outcome) (Result, error) {
	defer p.signal(t.Call.Key.Name)
	end, _ := p.enter() // Close waits for it: an answer in the journal is there before the state closes
	defer end()
	if res, ok := p.routineResult(t, o); ok {
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
		} else if bringsNews(o, res) {
			// Whatever call brought it, it is not routine for the key's lease.
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

// routineResult returns what Done tells the caller of t when t came from a
// lease, not broken, for which the answer o is routine (see leaseResult), or was
// admitted with budgets by which it is routine (see quickResult).
func (p *Pacer) routineResult(t Ticket, o Outcome) (Result, bool) {
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
func finished(t Ticket, o Outcome, st ledger.State) ledger.Attempt {
	var why reason.Reason
	var late *LateError
	switch {
	case errors.As(o.Err, &late):
		why = late.reason()
	case o.Err != nil:
		why = reason.Reason{Kind: reason.Failed, Error: o.Err.Error()}
	case o.Status > 0:
		why = reason.Reason{Kind: reason.Answered, Status: o.Status}
	}
	c := t.Call
	return ledger.Attempt{ID: t.ID, Key: c.Key.Name, CallID: c.CallID, Attempt: c.Attempt, Caller: c.Caller,
		Transport: c.Transport, Method: c.Method, Target: c.Target, Digest: c.Digest, State: st, Reason: why,
		Status: o.Status, SentAt: o.SentAt, AnsweredAt: o.AnsweredAt}
}

// finish records how t's attempt ended: in state st.
func finish(tx ledger.Tx, t Ticket, o Outcome, st ledger.State) error {
	a := finished(t, o, st)
	if t.Leased() {
		return tx.FinishReserved(a)
	}
	return tx.FinishAttempt(a.ID, a.State, a.Reason, a.Status, a.SentAt, a.AnsweredAt)
}

// record is Done's work in tx: it returns what was learnt and the key's
// pacing state as recorded.
func (p *Pacer) record(tx ledger.Tx, t Ticket, o Outcome) (Result, ledger.KeyState, error) {
	r, err := p.openRecord(tx, t, o)
	if err != nil {
		return r.res, r.ks, err
	}
	if err := r.keepObservations(); err != nil {
		return r.res, r.ks, err
	}
	r.weigh()
	if err := r.retryAfter(); err != nil {
		return r.res, r.ks, err
	}
	if err := r.abnormal(); err != nil {
		return r.res, r.ks, err
	}
	if err := r.newLimits(); err != nil {
		return r.res, r.ks, err
	}
	r.probe = r.ks.ProbeAttempt == t.ID
	routeOnly, err := r.routeFailure()
	if err != nil {
		return r.res, r.ks, err
	}
	if err := r.breaker(routeOnly); err != nil {
		return r.res, r.ks, err
	}
	return r.res, r.ks, r.close()
}

// A recording is one run of record: the answer o to t's attempt, read in
// tx, and what the run has made of it so far. It lives for that run alone.
type recording struct {
	p     *Pacer
	tx    ledger.Tx
	t     Ticket
	o     Outcome
	rd    *ratelimit.Reading  // o's reading; an empty one received at now when it has none
	now   time.Time           // when o was answered, or (no answer) when it is recorded
	basis time.Time           // the time later sends are counted from (see recordBasis)
	ks    ledger.KeyState     // the key's pacing state, as it will be recorded
	known []ledger.SeenPolicy // the policies known before o
	res   Result

	exhausted bool // o shows a policy exhausted
	grew      bool // a policy not kept before was recorded
	guided    bool // o says when to come back
	failure   bool // o is a refusal, or a failure of the upstream
	short     bool // a refusal whose own wait is too short to trust (see weigh)
	probe     bool // t was the key's probe
}

// recordBasis is what the answer o to t is taken to follow: later sends
// are subtracted from what it says.
func recordBasis(t Ticket, o Outcome) time.Time {
	basis := o.SentAt
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
	return basis
}

// openRecord reads what recording o needs in tx: the key's pacing state
// and known policies. It notes how long after its admission the call was
// answered.
func (p *Pacer) openRecord(tx ledger.Tx, t Ticket, o Outcome) (*recording, error) {
	c := t.Call
	r := &recording{p: p, tx: tx, t: t, o: o, now: o.AnsweredAt}
	if r.now.IsZero() {
		r.now = p.now()
	}
	r.basis = recordBasis(t, o)
	var err error
	if r.ks, err = tx.KeyState(c.Key.Name); err != nil {
		return r, err
	}
	r.rd = o.Reading
	if r.rd == nil {
		r.rd = &ratelimit.Reading{ReceivedAt: r.now}
	}
	r.res = Result{State: classify(o, r.rd)}
	if r.known, err = tx.SeenPolicies(c.Key.Name); err != nil {
		return r, err
	}
	// How long after its admission this call was answered: a send may
	// reach the upstream that long after it is admitted (see margin).
	switch {
	case !o.AnsweredAt.IsZero():
		noteLatency(&r.ks, o.AnsweredAt.Sub(t.AdmittedAt), r.now, latencyPeriod(c.Key, r.known))
	case o.Err != nil && !o.CallerAbort:
		noteLatency(&r.ks, r.now.Sub(t.AdmittedAt), r.now, latencyPeriod(c.Key, r.known))
	}
	return r, nil
}

// keepObservations keeps every observation with its context; fresh ones
// become the latest observation on their policy.
func (r *recording) keepObservations() error {
	c, tx, rd := r.t.Call, r.tx, r.rd
	key := c.Key.Name
	for _, rec := range observations(r.t, r.o) {
		if err := tx.AddObservation(rec); err != nil {
			return err
		}
		ob := rec.Observation
		if ob.HasRemaining && ob.Remaining <= 0 {
			r.exhausted = true
		}
		if rd.FromCache {
			continue
		}
		var prev *ledger.SeenPolicy
		for i, k := range r.known {
			if k.Policy == ob.Policy && k.Unit == ob.Unit && k.Partition == ob.Partition {
				prev = &r.known[i]
			}
		}
		r.grew = r.grew || prev == nil
		var err error
		if ob, err = learnLeak(tx, key, ob, rd.ReceivedAt, r.basis, r.o.Status, prev); err != nil {
			return err
		}
		if ob, err = tightenReset(tx, c.Key, ob, rd.ReceivedAt, r.t.AdmittedAt, r.basis, prev, r.ks); err != nil {
			return err
		}
		if err := tx.PutSeenPolicy(ledger.SeenPolicy{Key: key, Observation: ob, ReceivedAt: rd.ReceivedAt, BasisAt: r.basis,
			Route: c.route()}); err != nil {
			return err
		}
	}
	return nil
}

// weigh says whether the answer is a failure, and whether it says when to
// come back.
func (r *recording) weigh() {
	o, rd := r.o, r.rd
	r.guided = rd.HasRetryAfter || r.exhausted
	r.failure = rd.Throttled || o.Status == http.StatusTooManyRequests || serverTrouble(o.Status) || (o.Err != nil && !o.CallerAbort)
	// A refusal whose own wait is shorter than RetryFloor is no guidance:
	// it backs off, and counts towards the circuit breaker.
	r.short = r.failure && r.guided && serverWait(rd) < RetryFloor
	if r.short {
		r.guided = false
	}
}

// retryAfter gates the key until the answer's Retry-After. It is the
// server's decision: nothing goes before it. Jitter only adds, so callers
// released together do not return together. A wait that holds for the
// request's route alone (Slack's per-method tiers) is kept by that route's
// exhausted policy instead of a gate on the whole key.
func (r *recording) retryAfter() error {
	rd, now := r.rd, r.now
	if !rd.HasRetryAfter {
		return nil
	}
	until := now.Add(rd.RetryAfter)
	until = until.Add(time.Duration(r.p.rand() * 0.1 * float64(min(rd.RetryAfter, 10*time.Second))))
	if !rd.RetryAfterPerRoute {
		if err := r.tx.PutGate(ledger.Gate{Key: r.t.Call.Key.Name, Until: until, Source: ledger.RetryAfterGate, SetAt: now,
			Reason: reason.Reason{Kind: reason.RetryAfterAsked, Status: r.o.Status, For: rd.RetryAfter}}); err != nil {
			return err
		}
	}
	r.res.RetryIn = until.Sub(now)
	return nil
}

// abnormal pauses the key when the upstream reported abnormal usage, and
// passes on an answer's request not to retry.
func (r *recording) abnormal() error {
	rd, now, key := r.rd, r.now, r.t.Call.Key.Name
	if rd.Abnormal {
		until := now.Add(max(rd.RetryAfter, AbnormalPause))
		msg := reason.Reason{Kind: reason.Abnormal, Key: key, Violated: violated(rd.Problem), Until: until}
		if err := r.tx.PutGate(ledger.Gate{Key: key, Until: until, Source: ledger.AbnormalUsageGate, SetAt: now, Reason: msg}); err != nil {
			return err
		}
		if err := r.tx.AddWarning(ledger.Warning{Key: key, At: now, Kind: "abnormal-usage", Reason: msg}); err != nil {
			return err
		}
		r.res.Warnings = append(r.res.Warnings, msg)
		r.res.DoNotRetry = true
	}
	if rd.DoNotRetry {
		r.res.DoNotRetry = true
	}
	return nil
}

// newLimits infers a limit nobody announced from a refusal nothing we saw
// explains, and bounds the policies kept when a new one made them too many.
func (r *recording) newLimits() error {
	o, rd := r.o, r.rd
	refused := rd.Throttled || o.Status == http.StatusTooManyRequests
	if refused && !r.exhausted && !rd.Abnormal && !rd.Secondary { // a secondary limit is its wait alone
		// Nothing we saw explains the refusal: a limit nobody announced.
		msg, err := r.p.hiddenLimit(r.tx, r.t, rd, r.now)
		if err != nil {
			return err
		}
		if !msg.IsZero() {
			r.res.Warnings = append(r.res.Warnings, msg)
			r.grew = true
		}
	}
	if k := r.t.Call.Key; r.grew && full(k, r.known) {
		if msg, err := bound(r.tx, k, r.now, maxTime(r.ks.LastResponseAt, r.now)); err != nil {
			return err
		} else if !msg.IsZero() {
			r.res.Warnings = append(r.res.Warnings, msg)
		}
	}
	return nil
}

// routeFailure backs off the request's route alone when the failure is
// evidence about that route only (see failRoute); it says whether it was.
func (r *recording) routeFailure() (routeOnly bool, err error) {
	if !r.failure || r.guided || (r.probe && r.ks.HalfOpen) || !routeEvidence(r.o, r.rd) {
		return false, nil
	}
	routeOnly, wait, msg, err := r.p.failRoute(r.tx, r.t, r.o, r.rd, r.now)
	if err != nil {
		return routeOnly, err
	}
	r.res.RetryIn = max(r.res.RetryIn, wait)
	if !msg.IsZero() {
		r.res.Warnings = append(r.res.Warnings, msg)
	}
	return routeOnly, nil
}

// breaker counts a failure without guidance towards the circuit breaker,
// and backs off or opens the circuit; a success closes it.
func (r *recording) breaker(routeOnly bool) error {
	switch {
	case routeOnly:
		// Backed off on its route alone: the key goes on as it was.
	case r.failure && !r.guided && !r.rd.Abnormal:
		r.ks.Failures++
		reopen := r.probe && r.ks.HalfOpen
		var err error
		if r.ks.Failures >= BreakerThreshold || reopen {
			err = r.openCircuit(reopen)
		} else {
			err = r.backOff()
		}
		if err != nil {
			return err
		}
		r.ks.Interval = max(r.ks.Interval, slowStart(r.t.Call.Key, nil))
	case r.failure:
		r.ks.Interval = max(r.ks.Interval, slowStart(r.t.Call.Key, nil))
	case r.o.CallerAbort && r.o.Status == 0:
		// No answer, and the upstream is not to blame: nothing learned.
	default:
		r.ks.Failures, r.ks.Opens, r.ks.HalfOpen = 0, 0, false
	}
	return nil
}

// openCircuit opens (or, when the half-open probe failed, reopens) the
// circuit: nothing goes until the cooldown ends, then one probe.
func (r *recording) openCircuit(reopen bool) error {
	key, now := r.t.Call.Key.Name, r.now
	cool := cooldown(r.ks.Opens)
	r.ks.Opens++
	r.ks.HalfOpen = true
	r.ks.Failures = 0
	why := reason.Reason{Kind: reason.CircuitOpen, Key: key, Failures: BreakerThreshold, For: cool}
	if reopen {
		why.Kind = reason.CircuitReopen
	}
	msg := why
	if err := r.tx.PutGate(ledger.Gate{Key: key, Until: now.Add(cool), Source: ledger.CircuitGate, SetAt: now, Reason: msg}); err != nil {
		return err
	}
	if err := r.tx.AddWarning(ledger.Warning{Key: key, At: now, Kind: "circuit-open", Reason: msg}); err != nil {
		return err
	}
	r.res.Warnings = append(r.res.Warnings, msg)
	r.res.RetryIn = max(r.res.RetryIn, cool)
	return nil
}

// backOff gates the key for the backoff of its latest failure in a row.
func (r *recording) backOff() error {
	d := backoff(r.ks.Failures, r.p.rand())
	why := reason.Reason{Kind: reason.BackOff, Status: r.o.Status, Failures: int64(r.ks.Failures), Short: r.short}
	if r.short {
		why.For = serverWait(r.rd)
	}
	if err := r.tx.PutGate(ledger.Gate{Key: r.t.Call.Key.Name, Until: r.now.Add(d), Source: ledger.BackoffGate, SetAt: r.now,
		Reason: why}); err != nil {
		return err
	}
	r.res.RetryIn = max(r.res.RetryIn, d)
	return nil
}

// close ends the probe t was, writes the key's pacing state and finishes
// t's attempt.
func (r *recording) close() error {
	if r.probe {
		r.ks.ProbeAttempt, r.ks.ProbeUntil = 0, time.Time{}
	}
	if r.o.Status > 0 {
		r.ks.LastResponseAt = r.now
	}
	if err := r.tx.PutKeyState(r.ks); err != nil {
		return err
	}
	return finish(r.tx, r.t, r.o, r.res.State)
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
func classify(o Outcome, rd *ratelimit.Reading) ledger.State {
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

// violated names the policies pr says were violated, space-separated.
func violated(pr *ratelimit.Problem) string {
	if pr == nil {
		return ""
	}
	return strings.Join(pr.ViolatedPolicies, " ")
}
