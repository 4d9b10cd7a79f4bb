package pacer

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// Backoff and circuit-breaker settings, used when an upstream refuses or
// fails without saying when to come back.
const (
	BackoffBase      = time.Second
	BackoffCap       = time.Minute
	BreakerThreshold = 5                // consecutive refusals or failures without guidance
	BreakerCooldown  = 30 * time.Second // doubles with every reopening…
	BreakerMax       = 10 * time.Minute // …up to this
	// AbnormalPause is the least an "abnormal usage" answer pauses a key.
	AbnormalPause = 15 * time.Minute
)

// An Outcome is how an admitted attempt ended.
type Outcome struct {
	SentAt     time.Time
	AnsweredAt time.Time // zero when no answer came
	Status     int       // 0 when no answer came
	Err        error     // the transport error, when no answer came
	Reading    *ratelimit.Reading
}

// Advice tells a caller what to do next.
type Advice struct {
	Action     Action
	RetryAfter time.Duration // for Pause: come back after this long
	Reason     string        // one plain sentence
}

// A Result is what Done learned: the key's budgets after the answer, the
// tightest of them, what to do next, and warnings raised by the answer.
type Result struct {
	State      string // the attempt's final state
	Budgets    []Budget
	Binding    *Budget
	Advice     Advice
	Warnings   []string // new: hidden limit, abnormal usage, circuit open
	DoNotRetry bool     // the answer says not to retry, or retrying cannot help
	RetryIn    time.Duration
}

// Done records how t's attempt ended: its state, every observation its
// answer carried, the gates its signals set (Retry-After, backoff, an open
// circuit, an abnormal-usage pause), hidden limits it revealed, and the
// end of a probe. It returns the quota that now holds and the advice.
func (p *Pacer) Done(ctx context.Context, t Ticket, o Outcome) (Result, error) {
	defer p.signal(t.Call.Key.Name)
	var res Result
	err := p.db.Update(ctx, func(tx *state.Tx) error {
		var err error
		res, err = p.record(tx, t, o)
		if err != nil {
			return err
		}
		res.Budgets, res.Binding, res.Advice, err = p.advise(tx, t.Call, p.now())
		return err
	})
	if err != nil {
		return res, fmt.Errorf("pacer: record %s: %w", t.Call.Key.Name, err)
	}
	return res, nil
}

func (p *Pacer) record(tx *state.Tx, t Ticket, o Outcome) (Result, error) {
	c := t.Call
	key := c.Key.Name
	now := o.AnsweredAt
	if now.IsZero() {
		now = p.now()
	}
	ks, err := tx.KeyState(key)
	if err != nil {
		return Result{}, err
	}
	rd := o.Reading
	if rd == nil {
		rd = &ratelimit.Reading{ReceivedAt: now}
	}
	res := Result{State: classify(o, rd)}
	reason := ""
	switch {
	case o.Err != nil:
		reason = o.Err.Error()
	case o.Status > 0:
		reason = fmt.Sprintf("HTTP %d %s", o.Status, http.StatusText(o.Status))
	}

	// Every observation is kept with its context; fresh ones become the
	// latest word on their policy.
	exhausted := false
	for _, ob := range rd.Observations {
		if ob.Policy == "" {
			ob.Policy = unnamedPolicy
		}
		if ob.Unit == "" {
			ob.Unit = ratelimit.Requests
		}
		if err := tx.AddObservation(state.ObservationRecord{Key: key, AttemptID: t.ID, Observation: ob, Status: o.Status,
			ReceivedAt: rd.ReceivedAt, ServerDate: rd.ServerDate, FromCache: rd.FromCache, Method: c.Method, Target: c.Target}); err != nil {
			return res, err
		}
		if ob.HasRemaining && ob.Remaining <= 0 {
			exhausted = true
		}
		if rd.FromCache {
			continue
		}
		if err := tx.PutKnown(state.Known{Key: key, Observation: ob, ReceivedAt: rd.ReceivedAt, BasisAt: o.SentAt,
			Route: c.route()}); err != nil {
			return res, err
		}
	}

	guided := rd.HasRetryAfter || exhausted
	failure := rd.Throttled || o.Status == http.StatusTooManyRequests || serverTrouble(o.Status) || o.Err != nil

	// Retry-After is the server's decision: nothing goes before it. Jitter
	// only adds, so callers released together do not return together.
	if rd.HasRetryAfter {
		until := now.Add(rd.RetryAfter)
		until = until.Add(time.Duration(p.rand() * 0.1 * float64(min(rd.RetryAfter, 10*time.Second))))
		if err := tx.PutGate(state.Gate{Key: key, Until: until, Source: "retry-after", SetAt: now,
			Reason: fmt.Sprintf("the upstream answered %d with Retry-After: nothing is sent before it", o.Status)}); err != nil {
			return res, err
		}
		res.RetryIn = until.Sub(now)
	}

	if rd.Abnormal {
		until := now.Add(max(rd.RetryAfter, AbnormalPause))
		msg := fmt.Sprintf("the upstream reported abnormal usage of key '%s'%s; calls are paused until %s — check what is calling it before resuming",
			key, violated(rd.Problem), until.UTC().Format(time.RFC3339))
		if err := tx.PutGate(state.Gate{Key: key, Until: until, Source: "abnormal-usage", SetAt: now, Reason: msg}); err != nil {
			return res, err
		}
		if err := tx.AddWarning(state.Warning{Key: key, At: now, Kind: "abnormal-usage", Message: msg}); err != nil {
			return res, err
		}
		res.Warnings = append(res.Warnings, msg)
		res.DoNotRetry = true
	}
	if rd.DoNotRetry {
		res.DoNotRetry = true
	}

	refused := rd.Throttled || o.Status == http.StatusTooManyRequests
	if refused && !exhausted && !rd.Abnormal {
		// Nothing we saw explains the refusal: a limit nobody announced.
		msg, err := p.hiddenLimit(tx, c, rd, now)
		if err != nil {
			return res, err
		}
		res.Warnings = append(res.Warnings, msg)
	}

	switch {
	case failure && !guided && !rd.Abnormal:
		ks.Failures++
		if ks.Failures >= BreakerThreshold {
			cool := min(time.Duration(float64(BreakerCooldown)*math.Pow(2, float64(ks.Opens))), BreakerMax)
			ks.Opens++
			ks.HalfOpen = true
			ks.Failures = 0
			msg := fmt.Sprintf("the circuit for key '%s' opened after %d refusals or failures without guidance; one probe goes after %s",
				key, BreakerThreshold, seconds(cool))
			if err := tx.PutGate(state.Gate{Key: key, Until: now.Add(cool), Source: "circuit", SetAt: now, Reason: msg}); err != nil {
				return res, err
			}
			if err := tx.AddWarning(state.Warning{Key: key, At: now, Kind: "circuit-open", Message: msg}); err != nil {
				return res, err
			}
			res.Warnings = append(res.Warnings, msg)
			res.RetryIn = max(res.RetryIn, cool)
		} else {
			// Exponential backoff with full jitter, capped before the jitter.
			d := min(BackoffCap, BackoffBase<<min(ks.Failures-1, 16))
			d = time.Duration(p.rand() * float64(d))
			if err := tx.PutGate(state.Gate{Key: key, Until: now.Add(d), Source: "backoff", SetAt: now,
				Reason: fmt.Sprintf("the upstream answered %s without saying when to come back; backing off (attempt %d)", statusWord(o), ks.Failures)}); err != nil {
				return res, err
			}
			res.RetryIn = max(res.RetryIn, d)
		}
		ks.Interval = max(ks.Interval, slowStart(c.Key, nil))
	case failure:
		ks.Interval = max(ks.Interval, slowStart(c.Key, nil))
	default:
		ks.Failures, ks.Opens, ks.HalfOpen = 0, 0, false
	}
	if ks.ProbeAttempt == t.ID {
		ks.ProbeAttempt, ks.ProbeUntil = 0, time.Time{}
		if failure && !ks.HalfOpen && !guided {
			ks.HalfOpen = true // the probe failed: the next call probes again
		}
	}
	if o.Status > 0 {
		ks.LastResponseAt = now
	}
	if err := tx.PutKeyState(ks); err != nil {
		return res, err
	}
	return res, tx.FinishAttempt(t.ID, res.State, reason, o.Status, o.SentAt, o.AnsweredAt)
}

// unnamedPolicy names observations whose upstream named no policy.
const unnamedPolicy = "x-ratelimit"

// hiddenLimit records a limit a refusal revealed: named by the problem's
// violated-policies when it names one we did not know, else "hidden". It
// is inferred as what this key sent in the longest window we know (at
// least a minute), doubling that window each time the same limit refuses
// again, and is enforced locally from then on.
func (p *Pacer) hiddenLimit(tx *state.Tx, c Call, rd *ratelimit.Reading, now time.Time) (string, error) {
	known, err := tx.Known(c.Key.Name)
	if err != nil {
		return "", err
	}
	name := "hidden"
	if rd.Problem != nil {
		for _, v := range rd.Problem.ViolatedPolicies {
			if !slices.ContainsFunc(known, func(k state.Known) bool { return k.Policy == v && !k.Hidden }) {
				name = v
				break
			}
		}
	}
	w := time.Minute
	for _, pol := range c.Key.Policies {
		w = max(w, pol.Window)
	}
	for _, k := range known {
		if k.Window > 0 && !k.Hidden {
			w = max(w, k.Window)
		}
	}
	for _, k := range known {
		if k.Policy == name && k.Hidden {
			w = max(w, 2*k.Window)
		}
	}
	w = max(w, rd.RetryAfter)
	n, err := tx.Count(c.Key.Name, now.Add(-w))
	if err != nil {
		return "", err
	}
	q := max(int64(n)-1, 1) // the refused call did not count upstream
	k := state.Known{Key: c.Key.Name, ReceivedAt: now, BasisAt: now, Hidden: true, Route: c.route(),
		Observation: ratelimit.Observation{Policy: name, Unit: ratelimit.Requests, Quota: q, HasQuota: true, Window: w,
			Shape: ratelimit.ShapeInferred}}
	if err := tx.PutKnown(k); err != nil {
		return "", err
	}
	msg := fmt.Sprintf("key '%s' hit a limit the upstream never announced (%s); it is now enforced locally as %d calls per %s",
		c.Key.Name, name, q, seconds(w))
	return msg, tx.AddWarning(state.Warning{Key: c.Key.Name, At: now, Kind: "hidden-limit", Message: msg})
}

// classify turns an outcome into an attempt state.
func classify(o Outcome, rd *ratelimit.Reading) string {
	switch {
	case o.Status == 0:
		return state.Failed
	case rd.Throttled || o.Status == http.StatusTooManyRequests:
		return state.RejectedUpstream
	case o.Status == http.StatusAccepted:
		return state.Accepted
	case o.Status < 400:
		return state.Confirmed
	case o.Status < 500:
		return state.RejectedUpstream
	}
	return state.Failed
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
