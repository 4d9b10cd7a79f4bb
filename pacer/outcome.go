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
// answer alone ends stops before it (see endLeaseBefore); once it
// committed, a lease its plan says ends stops too, and so does the key's
// lease when the answer is news, though it was granted since the first
// stopped (an admission that took the key's lock first could not see the
// answer).
func (p *Pacer) Done(ctx context.Context, t Ticket, o Outcome) (Result, error) {
	defer p.signal(t.Call.Key.Name)
	end, _ := p.enter() // Close waits for it: an answer in the journal is there before the state closes
	defer end()
	j := p.judge(t, o)
	if j.routine {
		// Only the call and its answer's observations are recorded now,
		// through the process's journal (see state.FinishLater); what they
		// teach waits for the key's next transaction (see learned).
		fin := ledger.Finished{Attempt: finished(t, o, j.res.State), Observations: observations(t, o)}
		if err := p.db.FinishLater(ctx, fin); err != nil {
			return j.res, fmt.Errorf("pacer: record %s: %w", t.Call.Key.Name, err)
		}
		p.learn(t, o)
		return j.res, nil
	}
	ended := p.endLeaseBefore(t, j)
	// An outcome that failed before is pending for the key's next
	// transaction, which may have recorded it already (see pending.go).
	retried := p.dropPending(t)
	var plan outcomePlan
	err := p.update(ctx, func(tx ledger.Tx) error {
		var err error
		plan, err = p.recordDone(tx, t, o, retried, ended)
		return err
	}, t.Call.Key.Name)
	if err != nil {
		switch {
		case commitUnknown(err):
			// It may have committed: the key's next transaction here
			// records the outcome unless it is, and gives back the
			// ended lease's slots still reserved (see pending.go).
			p.keepPending(p.pendingOutcome(t, o), p.pendingRelease(ended))
		case ended != nil:
			p.giveBack(ended) // rolled back: its slots are still reserved
		}
		return plan.res, fmt.Errorf("pacer: record %s: %w", t.Call.Key.Name, err)
	}
	p.endLeases(plan)
	return plan.res, nil
}

// A judgement is what Done makes of an answer before any transaction,
// from the answer alone.
type judgement struct {
	res     Result // what the caller is told when routine: its State otherwise
	routine bool   // the answer is routine: no transaction of its own records it
	// endsLease: the answer alone ends a lease: t's own, for which it is
	// not routine, or, for an unleased call, the key's, for it is news.
	endsLease bool
}

// judge judges the answer o to t: whether it is routine (t came from a
// lease, not broken, for which o is routine, see leaseResult, or was
// admitted with budgets by which it is, see quickResult), and whether it
// ends a lease by itself.
func (p *Pacer) judge(t Ticket, o Outcome) judgement {
	rd := o.Reading
	if rd == nil {
		rd = &ratelimit.Reading{}
	}
	said := Result{State: classify(o, rd)}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	j := judgement{res: said}
	if t.lease != nil {
		j.res, j.routine = p.leaseResult(t, o, said, p.now())
		j.endsLease = !j.routine
	} else {
		if !closed {
			j.res, j.routine = p.quickResult(t, o)
		}
		j.endsLease = bringsNews(o, said)
	}
	if closed {
		j.routine = false // nothing would write what it teaches
	}
	if !j.routine {
		j.res = said
	}
	return j
}

// endLeaseBefore ends the lease the answer judged j ends by itself (a
// refusal, a failure, a gate or a warning it carries, a budget t's lease
// did not know or holds too little of): t's own lease, or, for an
// unleased call, the key's. It stops handing out slots at once, before
// Done's transaction, once, and returns the lease, whose unused slots
// that transaction gives back; nil when it ended none (or another ended
// it).
func (p *Pacer) endLeaseBefore(t Ticket, j judgement) *lease {
	if !j.endsLease {
		return nil
	}
	l := t.lease
	if l == nil {
		l = p.currentLease(t.Call.Key.Name)
	}
	return p.breakLease(l)
}

// unused are the slots of l never handed out, once l is no longer the
// Pacer's (see breakLease): none will be. nil when l is.
func (l *lease) unused() *slotRange {
	if l == nil {
		return nil
	}
	return &slotRange{key: l.key, first: l.next, last: l.last}
}

// endLeases ends, once Done's transaction committed, the leases its plan
// says end, and gives their unused slots back, in a transaction of their
// own: t's lease, for which only what the transaction read made the
// answer not routine (the first policy past the bound), and, when the
// answer is news, the key's current lease.
func (p *Pacer) endLeases(plan outcomePlan) {
	if l := p.breakLease(plan.endLease); l != nil {
		p.giveBack(l)
	}
	if plan.endKeyLease == "" {
		return
	}
	if l := p.breakLease(p.currentLease(plan.endKeyLease)); l != nil {
		p.giveBack(l)
	}
}

// recordDone is Done's work in tx: it records t's outcome (unless retried
// and recorded already), advises, and gives back the unused slots of
// ended, the lease the answer ended before. Its plan says which leases end once tx
// committed (see endLeases). It changes nothing in memory.
func (p *Pacer) recordDone(tx ledger.Tx, t Ticket, o Outcome, retried bool, ended *lease) (outcomePlan, error) {
	plan, err := p.recordOnce(tx, t, o, retried)
	if err != nil {
		return plan, err
	}
	now := p.now()
	routine := false
	if t.lease != nil {
		var r Result
		if r, routine = p.leaseResult(t, o, plan.res, now); routine {
			plan.res = r
		} else {
			plan.endLease = t.lease // ended before, unless only what tx read ends it
		}
	}
	if !routine && bringsNews(o, plan.res) {
		// Whatever call brought it, it is not routine for the key's
		// lease: the one current once tx committed, though granted
		// after the lease ended before (or none was).
		plan.endKeyLease = t.Call.Key.Name
	}
	if !routine {
		if plan.res.Budgets, plan.res.Binding, plan.res.Advice, err = p.advise(tx, t.Call, now, *plan.keyState); err != nil {
			return plan, err
		}
	}
	// Whether routine or not, and after advising (the order Done always
	// had: the budgets it tells count them as reserved).
	give := outcomePlan{release: ended.unused()}
	plan.add(give)
	return plan, apply(tx, give)
}
