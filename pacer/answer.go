package pacer

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// An outcomeView is what the outcome's rules read of a transaction: a
// ledger.Tx is one, and the rule tests give them a fake with no database.
type outcomeView interface {
	KeyState(key string) (ledger.KeyState, error)
	SeenPolicies(key string) ([]ledger.SeenPolicy, error)
	Count(key string, since time.Time) (int, error)
	Nth(key string, since time.Time, n int) (time.Time, error)
	Bytes(key string, since time.Time) (int64, error)
	Sends(key string, since time.Time, limit int) ([]ledger.Send, error)
	Warned(key string, kind ledger.WarningKind, since time.Time) (bool, error)
	PathState(key, scope string) (ledger.PathState, error)
	FailingPaths(key string, since time.Time) (int, error)
}

// An answer is the answer o to t's attempt, with what the outcome's rules
// weigh it against: the key's pacing state and the policies seen before
// it, as read once in the transaction, and what follows from them alone.
// It is a value: the rules read it and return their parts of the plan.
type answer struct {
	t             Ticket
	o             Outcome
	rd            *ratelimit.Reading  // o's reading; an empty one received at now when it has none
	now           time.Time           // when o was answered, or (no answer) when it is recorded
	basis         time.Time           // the time later sends are counted from (see recordBasis)
	ks            ledger.KeyState     // the key's pacing state, o's latency noted
	priorPolicies []ledger.SeenPolicy // the key's policies seen before o

	exhausted bool // o shows a policy exhausted
	grew      bool // o shows a policy not seen before (its answer fresh)
	guided    bool // o says when to come back
	failure   bool // o is a refusal, or a failure of the upstream
	short     bool // a refusal whose own wait is too short to trust (see weigh)
	probe     bool // t was the key's probe
}

// readAnswer reads in v what the answer o to t is weighed against, at now
// when o has no time of its own.
func readAnswer(v outcomeView, t Ticket, o Outcome, now time.Time) (*answer, error) {
	ks, err := v.KeyState(t.Call.Key.Name)
	if err != nil {
		return nil, err
	}
	priorPolicies, err := v.SeenPolicies(t.Call.Key.Name)
	if err != nil {
		return nil, err
	}
	return newAnswer(t, o, ks, priorPolicies, now), nil
}

// newAnswer is the answer o to t, weighed against the key's pacing state
// ks and the policies seen before o (priorPolicies), at now when o has no time of its own. It
// notes in ks how long after its admission the call was answered: a send
// may reach the upstream that long after it is admitted (see margin).
func newAnswer(t Ticket, o Outcome, ks ledger.KeyState, priorPolicies []ledger.SeenPolicy, now time.Time) *answer {
	a := &answer{t: t, o: o, now: o.AnsweredAt, basis: recordBasis(t, o), ks: ks, priorPolicies: priorPolicies}
	if a.now.IsZero() {
		a.now = now
	}
	a.rd = o.Reading
	if a.rd == nil {
		a.rd = &ratelimit.Reading{ReceivedAt: a.now}
	}
	switch period := latencyPeriod(t.Call.Key, priorPolicies); {
	case !o.AnsweredAt.IsZero():
		noteLatency(&a.ks, o.AnsweredAt.Sub(t.AdmittedAt), a.now, period)
	case o.Err != nil && !o.CallerAbort:
		noteLatency(&a.ks, a.now.Sub(t.AdmittedAt), a.now, period)
	}
	for _, rec := range observations(t, o) {
		ob := rec.Observation
		a.exhausted = a.exhausted || (ob.HasRemaining && ob.Remaining <= 0)
		a.grew = a.grew || (!a.rd.FromCache && a.seen(ob) == nil)
	}
	a.weigh()
	a.probe = a.ks.ProbeAttempt == t.ID
	return a
}

// seen returns the policy seen before the answer that ob speaks of; nil
// when there is none.
func (a *answer) seen(ob ratelimit.Observation) *ledger.SeenPolicy {
	var prev *ledger.SeenPolicy
	for i, k := range a.priorPolicies {
		if k.Policy == ob.Policy && k.Unit == ob.Unit && k.Partition == ob.Partition {
			prev = &a.priorPolicies[i]
		}
	}
	return prev
}

// weigh says whether the answer is a failure, and whether it says when to
// come back.
func (a *answer) weigh() {
	o, rd := a.o, a.rd
	a.guided = rd.HasRetryAfter || a.exhausted
	a.failure = rd.Throttled || o.Status == http.StatusTooManyRequests || serverTrouble(o.Status) || (o.Err != nil && !o.CallerAbort)
	// A refusal whose own wait is shorter than RetryFloor is no guidance:
	// it backs off, and counts towards the circuit breaker.
	a.short = a.failure && a.guided && serverWait(rd) < RetryFloor
	if a.short {
		a.guided = false
	}
}

// observe keeps every observation with its context; fresh ones become the
// latest observation on their policy, a leaky bucket's rate learned and
// a window's end tightened by what v's log proves (see learnLeak,
// tightenReset).
func (a *answer) observe(v outcomeView) (outcomePlan, error) {
	c := a.t.Call
	var part outcomePlan
	for _, rec := range observations(a.t, a.o) {
		part.observations = append(part.observations, rec)
		if a.rd.FromCache {
			continue
		}
		ob, prev := rec.Observation, a.seen(rec.Observation)
		var err error
		if ob, err = learnLeak(v, c.Key.Name, ob, a.rd.ReceivedAt, a.basis, a.o.Status, prev); err != nil {
			return part, err
		}
		if ob, err = tightenReset(v, c.Key, ob, a.rd.ReceivedAt, a.t.AdmittedAt, a.basis, prev, a.ks); err != nil {
			return part, err
		}
		part.seen = append(part.seen, putSeen(ledger.SeenPolicy{Key: c.Key.Name, Observation: ob,
			ReceivedAt: a.rd.ReceivedAt, BasisAt: a.basis, Route: c.route()}))
	}
	return part, nil
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
