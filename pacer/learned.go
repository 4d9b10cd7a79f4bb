package pacer

import (
	"context"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A routine answer of a lease (see lease.go), or an unleased call's
// admission judged routine (see fastpath.go), is recorded at once with what
// it said — the call's state and every observation of its answer — before
// its caller hears it, through the process's journal where it has one
// (see state.FinishLater). What it teaches the key's pacing state and the
// latest observation on each of its policies waits, in memory, for the key's
// next transaction in this process — an admission, an answer that
// is not routine, the lease's end, a status — or learnedWait at most
// (LeaseTime, or up to a second on a key whose windows are long): on a
// busy key, many answers are written there as one.
//
// Only routine answers wait: a routine answer leaves every
// budget far from its limits, resets no failure count (a key with failures
// is not leased) and sets no gate. What waits is written in any order:
// a latest observation only replaces an older one, a latency only lengthens the
// one kept, an answer's time only moves the last answer's later. Another
// process meanwhile counts the lease's slots as spent, and reads a latest
// observation up to learnedWait older, which projects no more than the newer would:
// every send since its basis is subtracted from it. A process that ends
// before writing it leaves the same older observation.
type learned struct {
	key          *keystore.Key
	observations []learnedObservation // the latest observation of each policy
	timed        bool                 // an answer came with its time: latency is one
	latency      time.Duration        // the longest from an admission to its answer
	answeredAt   time.Time            // the latest answer
	wait         time.Duration        // the longest it waits (see learnedWait)
	stop         func() bool          // stops the timer that writes it
	since        time.Time            // when the first of it was kept (see takeDue)
	due          time.Time            // when that timer writes it
	// renewFrom is when the latest observations other processes read of
	// the key, which it would replace, are half-way to their end from
	// when they were read: the key's next admission writes it from then
	// on (see takeDue); renewBy, three quarters of the way, is when its
	// timer does, if no admission came. Zero when none ends.
	renewFrom, renewBy time.Time
}

// learnedWaitMax is the longest what routine answers taught waits in
// memory for the key's next transaction (see learnedWait).
const learnedWaitMax = time.Second

// learnedWindowShare: what routine answers taught waits at most a tenth
// of the shortest window of the budgets they were judged by.
const learnedWindowShare = 10

// learnedWait returns how long what routine answers taught waits at most
// for the key's next transaction in this process, when they were judged
// routine by budgets: LeaseTime, or longer on a key whose windows are long
// — 1/learnedWindowShare of the shortest, a quarter of the soonest reset
// an observation announced — up to learnedWaitMax. On a key called a few
// times a second, the next admission then writes it, not a transaction of
// its own (see quickBudgets). Another process meanwhile reads the key's
// older observations, still within their windows.
func learnedWait(budgets []Budget) time.Duration {
	wait := learnedWaitMax
	for _, b := range budgets {
		if b.Window > 0 {
			wait = min(wait, b.Window/learnedWindowShare)
		}
		if !b.Observed.IsZero() && b.Reset > 0 {
			wait = min(wait, b.Reset/4)
		}
	}
	return max(wait, LeaseTime)
}

// A learnedObservation is an observation the pacer keeps: what an answer said of one
// policy, when, and to which call.
type learnedObservation struct {
	ob                          ratelimit.Observation
	receivedAt, admitted, basis time.Time
	route                       string
}

// learn keeps what the routine answer o to t teaches, for the key's next
// transaction to write.
func (p *Pacer) learn(t Ticket, o Outcome) {
	l := &learned{key: t.Call.Key, answeredAt: o.AnsweredAt, wait: learnedWait(t.judgedBy())}
	l.renewFrom, l.renewBy = renewal(t.judgedBy(), t.AdmittedAt)
	if l.timed = !o.AnsweredAt.IsZero(); l.timed {
		l.latency = o.AnsweredAt.Sub(t.AdmittedAt)
	} else {
		l.answeredAt = p.now()
	}
	// A lease's slots are all recorded at its grant (see record); an
	// unleased call's answer counts from its send.
	basis := t.AdmittedAt.Add(-time.Microsecond)
	if t.lease == nil && !t.granted {
		basis = t.AdmittedAt
		if !o.SentAt.IsZero() {
			basis = o.SentAt
		}
	}
	if rd := o.Reading; rd != nil && !rd.FromCache {
		for _, ob := range rd.Observations {
			l.observations = append(l.observations, learnedObservation{ob: normalized(ob), receivedAt: rd.ReceivedAt, admitted: t.AdmittedAt,
				basis: basis, route: t.Call.route()})
		}
	}
	p.keep(l)
}

// keep adds l to what the Pacer keeps for l's key, and makes sure a timer
// writes it within l.wait, and by l.renewBy when that is still to come.
func (p *Pacer) keep(l *learned) {
	name := l.key.Name
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	kept := p.learned[name]
	if kept == nil {
		kept = &learned{key: l.key, stop: func() bool { return false }, since: now}
		p.learned[name] = kept
	}
	wait := l.wait
	if l.renewBy.After(now) {
		// (One already past is left to the key's next admission: a
		// lease's answers share the budgets of its grant, and would
		// otherwise each have a transaction of their own once it passed.)
		wait = min(wait, l.renewBy.Sub(now))
	}
	if due := now.Add(wait); !p.closed && (kept.due.IsZero() || due.Before(kept.due)) { // after Close, nothing more is written
		kept.stop()
		kept.due, kept.wait = due, l.wait
		kept.stop = p.afterFunc()(wait, p.timerFunc(func() { p.writeLearnedAlone(name) }))
	}
	kept.merge(l)
}

// renewal returns when what an answer judged by budgets taught is
// written before the observations it would replace end: from half-way
// from the budgets' reading, at the call's admission (or its lease's
// grant), to the end of the soonest of them, by the key's next admission;
// three quarters of the way, by its timer, if none came. Those
// observations are what other processes read of the key; if it waited
// past their end (learnedDue and learnedWait may be longer than an
// upstream's reset), they would find them expired with no answer
// recorded since, and hold every call of the key for a probe (see
// expiredRule), answers having come all along. Zeros when no
// observation ends.
func renewal(budgets []Budget, read time.Time) (from, by time.Time) {
	var soonest time.Duration
	for _, b := range budgets {
		if !b.Observed.IsZero() && b.Reset > 0 && (soonest == 0 || b.Reset < soonest) {
			soonest = b.Reset
		}
	}
	if soonest == 0 {
		return time.Time{}, time.Time{}
	}
	return read.Add(soonest / 2), read.Add(soonest * 3 / 4)
}

// sooner returns the sooner of a and b, either of which may be zero
// (none).
func sooner(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// merge adds what l learned to k: the later observation of each policy, the
// longer latency, the later answer, the sooner renewal.
func (k *learned) merge(l *learned) {
	k.renewFrom, k.renewBy = sooner(k.renewFrom, l.renewFrom), sooner(k.renewBy, l.renewBy)
	if l.timed {
		k.latency = max(k.latency, l.latency)
		k.timed = true
	}
	k.answeredAt = maxTime(k.answeredAt, l.answeredAt)
	for _, w := range l.observations {
		i := 0
		for i < len(k.observations) && !samePolicy(k.observations[i].ob, w.ob) {
			i++
		}
		switch {
		case i == len(k.observations):
			k.observations = append(k.observations, w)
		case !w.receivedAt.Before(k.observations[i].receivedAt):
			k.observations[i] = w
		}
	}
}

func samePolicy(a, b ratelimit.Observation) bool {
	return a.Policy == b.Policy && a.Unit == b.Unit && a.Partition == b.Partition
}

// takeLearned removes from memory what the Pacer keeps for keys, for a
// transaction to write (see writeLearned); nil entries where there was
// nothing. What is taken must be kept again (relearn) if that transaction
// does not commit.
func (p *Pacer) takeLearned(keys []string) []*learned {
	p.mu.Lock()
	defer p.mu.Unlock()
	taken := make([]*learned, len(keys))
	for i, key := range keys {
		if l := p.learned[key]; l != nil {
			delete(p.learned, key)
			l.stop()
			taken[i] = l
		}
	}
	return taken
}

// writeLearned writes l in tx: the latest observations, then, when one
// was new and the key's policies are at a bound, the evictions (see
// bound), then the key's pacing state. It changes nothing in memory, so
// that a transaction run again writes the same.
func writeLearned(tx ledger.Tx, l *learned) error {
	key := l.key.Name
	ks, err := tx.KeyState(key)
	if err != nil {
		return err
	}
	known, err := tx.SeenPolicies(key)
	if err != nil {
		return err
	}
	part, grew, err := l.observe(tx, known, ks)
	if err == nil {
		err = apply(tx, part)
	}
	if err != nil {
		return err
	}
	if l.timed {
		noteLatency(&ks, l.latency, l.answeredAt, latencyPeriod(l.key, known))
	}
	ks.LastResponseAt = maxTime(ks.LastResponseAt, l.answeredAt)
	if grew && full(l.key, known) {
		part, err := bound(tx, l.key, l.answeredAt, ks.LastResponseAt)
		if err == nil {
			err = apply(tx, part)
		}
		if err != nil {
			return err
		}
	}
	return apply(tx, outcomePlan{keyState: &ks})
}

// observe plans to put each observation of l that is later than the one
// known of its policy, its window's end tightened by what v's log proves
// (see tightenReset), ks being the key's pacing state; grew says one was
// of a policy not known.
func (l *learned) observe(v outcomeView, known []ledger.SeenPolicy, ks ledger.KeyState) (part outcomePlan, grew bool, err error) {
	for _, w := range l.observations {
		var prev *ledger.SeenPolicy
		for i, k := range known {
			if k.Policy == w.ob.Policy && k.Unit == w.ob.Unit && k.Partition == w.ob.Partition {
				prev = &known[i]
			}
		}
		if prev != nil && prev.ReceivedAt.After(w.receivedAt) {
			continue // a later answer spoke already
		}
		grew = grew || prev == nil
		ob, err := tightenReset(v, l.key, w.ob, w.receivedAt, w.admitted, w.basis, prev, ks)
		if err != nil {
			return part, grew, err
		}
		part.seen = append(part.seen, putSeen(ledger.SeenPolicy{Key: l.key.Name, Observation: ob, ReceivedAt: w.receivedAt,
			BasisAt: w.basis, Route: w.route}))
	}
	return part, grew, nil
}

// relearn keeps again what a transaction that did not commit took to
// write.
func (p *Pacer) relearn(l *learned) {
	if l != nil {
		p.keep(l)
	}
}

// writeLearnedAlone writes what the Pacer keeps for key in a transaction
// of its own, when its timer says so. When that fails, what is kept is
// tried again its wait later (see learnedWait).
func (p *Pacer) writeLearnedAlone(key string) {
	if p.writeLearnedNow(context.Background(), key) == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.learned[key]; l != nil && !p.closed {
		l.stop()
		l.due = p.now().Add(l.wait)
		l.stop = p.afterFunc()(l.wait, p.timerFunc(func() { p.writeLearnedAlone(key) }))
	}
}

// writeLearnedNow writes what the Pacer keeps for key, when it keeps
// anything, in a transaction of its own.
func (p *Pacer) writeLearnedNow(ctx context.Context, key string) error {
	p.mu.Lock()
	none := p.learned[key] == nil
	p.mu.Unlock()
	if none {
		return nil
	}
	return p.update(ctx, func(ledger.Tx) error { return nil }, key)
}

// update runs fn in a write transaction that first writes what the Pacer
// keeps for keys (see writeLearned); when it does not commit, that is
// kept again.
//
// ledger.Store.Update may run its function more than once (a database
// retries a transaction after a deadlock or a dropped connection), so
// what is learned is taken from memory once, before it, and every run
// writes the same.
func (p *Pacer) update(ctx context.Context, fn func(ledger.Tx) error, keys ...string) error {
	return p.updateWriting(ctx, p.takeLearned(keys), fn, keys...)
}

// updateWriting is update, writing what was taken of what the Pacer
// keeps for keys, an entry for each key.
func (p *Pacer) updateWriting(ctx context.Context, taken []*learned, fn func(ledger.Tx) error, keys ...string) error {
	pending := p.takePending(keys) // what earlier transactions of keys left to write (see pending.go)
	err := p.db.Update(ctx, func(tx ledger.Tx) error {
		if err := p.writePending(tx, pending); err != nil {
			return err
		}
		for _, l := range taken {
			if l == nil {
				continue
			}
			if err := writeLearned(tx, l); err != nil {
				return err
			}
		}
		return fn(tx)
	}, keys...)
	if err != nil {
		for _, l := range taken {
			p.relearn(l)
		}
	}
	p.pendingEnded(pending, err)
	return err
}
