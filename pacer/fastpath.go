package pacer

import (
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// An unleased call whose admission found its key far from every limit,
// with nothing to watch for (no gate, no probe out, no failure, no
// budget near its low-water mark), has its answer judged routine as a
// lease's are: an ordinary answer about policies the key knows, leaving
// every budget clear of its low-water mark, is recorded through the
// process's journal (see learned.go), on either back end, and advised from
// the budgets its admission read, with this call spent — no transaction of
// its own. Its attempt was counted in every window at its admission, and
// stays counted; until the journal's applier records its end (within the
// journal's linger, a few milliseconds) other processes count it in flight.
// What it teaches (the latest observation on each policy, the latency, the
// last answer) is written by the key's next transaction in this process,
// an admission usually: the key must be called often enough here for one
// to come within the time what it teaches may wait (quickNext,
// learnedWait). Any other answer — a refusal, a failure, a Retry-After, a
// warning, a policy the key did not know, a budget it leaves near its
// low-water mark, the answer to a probe — is recorded and advised as
// before, in a transaction of its own.

// quickBudgets returns the budgets an answer to the call snap's decision
// d admits is advised from when that answer is routine: d's, with the
// call spent; nil when the call's answer is to be recorded in a
// transaction of its own whatever it says.
func (p *Pacer) quickBudgets(snap snapshot, d decision) []Budget {
	if !p.defers() || p.pace(snap.key.Name, snap.now)*learnedWait(d.budgets).Seconds() < quickNext {
		return nil
	}
	ks := snap.ks
	if !d.admit || d.probe || d.slow || len(snap.gates) > 0 || len(snap.key.Reserves) > 0 ||
		ks.Failures > 0 || ks.Opens > 0 || ks.HalfOpen || ks.ProbeAttempt != 0 {
		return nil
	}
	for _, kn := range snap.seen {
		// Partitions, other units and leaky buckets: what an answer
		// teaches of them is read against the log (see record).
		if kn.Partition != "" || !requests(kn.Unit) || isLeaky(kn) {
			return nil
		}
	}
	budgets := make([]Budget, len(d.budgets))
	for i, b := range d.budgets {
		if !requests(b.Unit) || b.Expired || !b.Observed.IsZero() && b.Reset <= 0 {
			return nil
		}
		if b.Remaining >= 0 {
			b.Remaining--
			if b.Remaining < 1 || low(b.Remaining, b.Limit, snap.key.LowWater) {
				return nil
			}
		}
		if b.Observed.IsZero() && b.Window > 0 {
			b.Used++
		}
		budgets[i] = b
	}
	return budgets
}

// quickNext is how many admissions of the key this process must be
// making, at its pace, in the time what an answer teaches may wait
// (learnedWait), for the answer to be routine: what it teaches is then
// written by the next of them, usually, not by a transaction of its own
// when that time runs out (see learned), which costs what the answer's
// own transaction would, off its caller's path.
//
// One, not more: a host calls its keys less often when the machine is
// busy, and a threshold its keys' pace then falls below sends their
// answers to transactions of their own, which makes the machine busier
// still. At 2, the 100-key cell of BenchmarkAdmissions (PostgreSQL, 10-s
// windows, each host calling each key 2 to 5 times a second) had 14-51%
// of its answers in transactions of their own in its slow runs; at 1,
// 0.2% at most in every run (docs/benchmarks-log.md).
const quickNext = 1

// quickResult is what Done tells the caller of t, admitted without a
// lease with budgets to judge its answer routine by (see quickBudgets), when the
// answer o is routine by them; ok is false otherwise. The call whose
// admission granted a lease has its answer judged as the lease's slots'
// are, by the lease's budgets, every slot spent: on either back end, a
// routine one goes through the journal as theirs do.
func (p *Pacer) quickResult(t Ticket, o Outcome) (Result, bool) {
	rd := o.Reading
	if rd == nil {
		rd = &ratelimit.Reading{}
	}
	if t.grant != nil {
		t.lease = t.grant // this copy only: the call's attempt is its own, not a slot
		return p.leaseResult(t, o, Result{State: classify(o, rd)}, p.now())
	}
	if t.quick == nil || t.granted {
		return Result{}, false
	}
	// Judged as the answer to a lease of one slot, its own, granted at
	// its admission.
	t.lease = &lease{key: t.Call.Key.Name, first: t.ID, next: t.ID + 1, last: t.ID, at: t.AdmittedAt, budgets: t.quick}
	res, ok := p.leaseResult(t, o, Result{State: classify(o, rd)}, p.now())
	for _, b := range res.Budgets {
		if b.Window > 0 && b.Reset > b.Window {
			return res, false // a reset the log may end sooner (see tightenReset)
		}
	}
	return res, ok
}

// A deferrer is a store on which recording an outcome through the
// process's journal spares a transaction of its own: round trips to a
// server on the key's row (PostgreSQL), or a commit of the state file
// (SQLite). A store without the method, or whose process has no journal,
// records every unleased call's answer in a transaction of its own.
type deferrer interface{ DefersOutcomes() bool }

// defers says whether p's store takes the outcomes of unleased calls
// through the journal (see quickBudgets).
func (p *Pacer) defers() bool {
	d, ok := p.db.(deferrer)
	return ok && d.DefersOutcomes()
}
