package pacer

import (
	"context"
	"fmt"
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
//
// What the answer changes is planned in a transaction (see record) and
// written there. Nothing in memory changes in that transaction's
// function, which may run more than once (see ledger.Store): a lease the
// answer alone ends stops before it (see endLeaseBefore), one that only
// what it read ends stops once it committed, from its last run's plan.
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
	ending := p.endLeaseBefore(t, o)
	// An outcome that failed before is kept for the key's next
	// transaction, which may have recorded it already (see unrecorded.go).
	retried := p.dropUnrecorded(t)
	var plan outcomePlan
	err := p.update(ctx, func(tx ledger.Tx) error {
		var err error
		plan, err = p.recordDone(tx, t, o, retried, ending)
		return err
	}, t.Call.Key.Name)
	if err != nil {
		p.keepUnrecorded(t, o, err)
		p.giveBackSlots(ending.unused) // the transaction did not: one of their own
		return plan.res, fmt.Errorf("pacer: record %s: %w", t.Call.Key.Name, err)
	}
	if l := p.breakLease(plan.endLease); l != nil {
		p.giveBack(l)
	}
	return plan.res, nil
}

// A leaseEnding is what Done learned of a lease before its transaction,
// from the answer alone.
type leaseEnding struct {
	// judged: the answer alone ends a lease (t's own, or the key's for an
	// unleased call), so the transaction ends none.
	judged bool
	// unused are the slots of the lease this answer ended, to give back
	// in Done's transaction; nil when it ended none (or another ended it).
	unused *slotRange
}

// endLeaseBefore ends the lease the answer o to t ends by itself (a
// refusal, a failure, a gate or a warning it carries, a budget t's lease
// did not know or holds too little of): t's own lease, or, for an
// unleased call, the key's. It stops handing out slots at once, before
// Done's transaction, once; that transaction gives the unused ones back.
// An answer that ends a lease only by what the transaction reads (the
// first policy past the bound) ends it once that transaction committed.
func (p *Pacer) endLeaseBefore(t Ticket, o Outcome) leaseEnding {
	rd := o.Reading
	if rd == nil {
		rd = &ratelimit.Reading{}
	}
	said := Result{State: classify(o, rd)}
	var l *lease
	switch {
	case t.lease != nil:
		if _, routine := p.leaseResult(t, o, said, p.now()); routine {
			return leaseEnding{}
		}
		l = t.lease
	case bringsNews(o, said):
		l = p.currentLease(t.Call.Key.Name)
	default:
		return leaseEnding{}
	}
	ended := leaseEnding{judged: true}
	if l = p.breakLease(l); l != nil {
		ended.unused = l.unused()
	}
	return ended
}

// unused are the slots of l never handed out, once l is no longer the
// Pacer's (see breakLease): none will be.
func (l *lease) unused() *slotRange {
	return &slotRange{key: l.key, first: l.next, last: l.last}
}

// giveBackSlots releases r (when not nil), slots of a lease no longer the
// Pacer's, in a transaction of its own. A failure leaves them reserved:
// counted as sent until the sweep releases them, which spends budget but
// never overspends it.
func (p *Pacer) giveBackSlots(r *slotRange) {
	if r == nil {
		return
	}
	_ = p.update(context.Background(), func(tx ledger.Tx) error { return apply(tx, outcomePlan{release: r}) }, r.key)
}

// recordDone is Done's work in tx: it records t's outcome (unless retried
// and recorded already), advises, and gives back the unused slots of the
// lease the answer ended before (ending). Its plan says which lease ends
// once tx committed, when only what tx holds says one does. It changes
// nothing in memory.
func (p *Pacer) recordDone(tx ledger.Tx, t Ticket, o Outcome, retried bool, ending leaseEnding) (outcomePlan, error) {
	plan, err := p.recordOnce(tx, t, o, retried)
	if err != nil {
		return plan, err
	}
	now := p.now()
	switch {
	case t.lease != nil:
		if r, ok := p.leaseResult(t, o, plan.res, now); ok {
			plan.res = r
			return plan, nil
		}
		if !ending.judged {
			plan.endLease = t.lease
		}
	case !ending.judged && bringsNews(o, plan.res):
		// Whatever call brought it, it is not routine for the key's lease.
		plan.endLease = p.currentLease(t.Call.Key.Name)
	}
	if plan.res.Budgets, plan.res.Binding, plan.res.Advice, err = p.advise(tx, t.Call, now, *plan.keyState); err != nil {
		return plan, err
	}
	give := outcomePlan{release: ending.unused}
	plan.add(give)
	return plan, apply(tx, give)
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
