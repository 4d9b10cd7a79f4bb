package pacer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A transaction of a key can leave work for the key's next one. Done's
// transaction can fail before it recorded an outcome (the database went
// away, or was past its bound); and any transaction's COMMIT can go out
// and get no answer (the connection dropped, or the caller left while it
// waited for it), so that what it wrote may stand or not: an admission's
// attempt, whose call fails and is never sent; the slots of the lease it
// granted, which is never installed; the slots of a lease it gave back
// (a renewal's spent lease, one an answer ended, one that ran out).
// Left as they are, the attempt would count as in flight until its
// in-flight timeout (two minutes), and as a probe hold every call of its
// key, in every process, for as long; the slots would count as sent and
// in flight as long, with no process to hand them out.
//
// Each is a pending write of its key, kept in memory: the key's next
// transaction in this process (any of them: an admission, an outcome,
// what was learned written alone, Close) writes it first, before it reads
// anything (see updateWriting). It records the outcome, or ends the
// attempt not sent, unless the attempt is finished in the state already
// (the transaction that left it committed after all, or a retry of Done
// did); it gives back those of the slots still reserved (none, when the
// grant did not commit or the give-back did). Writing one again changes
// nothing that was written.
//
// One rule decides what a transaction of a key that failed leaves (see
// commitUnknown): when it may have committed, what it may have written is
// pending; when it was rolled back, a lease's slots it was to give back
// are given back at once, in a transaction of their own, and an outcome
// it was to record is its caller's, who hears the error. And one rule
// ends a pending write:
//
//   - written: a transaction that wrote it committed. It is remembered
//     until it expires (and not written again), so that a retry of Done
//     finds that its outcome was pending and checks before recording it;
//   - kept: the transaction failed for the database's absence or its
//     caller leaving (see retryable): the key's next one writes it;
//   - given up: the transaction failed otherwise. A write that fails its
//     transaction would fail every later one of its key; its attempt and
//     slots are left to the sweep;
//   - expired: its attempt or its slots no longer count as in flight (the
//     in-flight timeout after the admission, or after the lease's end),
//     and the sweep ends them.

// A pendingWrite is one write that a key's next transaction in this
// process makes: the outcome of an attempt to record, or a lease's slots
// to give back. The zero pendingWrite is none.
type pendingWrite struct {
	key     string
	at      time.Time // when its attempt or its slots were admitted: pending writes are written oldest first
	expires time.Time // when it is forgotten: its attempt or its slots no longer count as in flight

	// One of these:
	t     *Ticket    // record the outcome o of t's attempt, unless it is finished…
	o     Outcome    // …which is this
	slots *slotRange // give back those of these slots still reserved

	written bool // a transaction that wrote it committed, or one failed so that it never will (under Pacer.mu)
}

// pendingOutcome is the write of t's outcome o; the zero pendingWrite when
// t came from a lease, whose slot's outcome is recorded through its own
// path (see leaseResult) or left to the sweep.
func (p *Pacer) pendingOutcome(t Ticket, o Outcome) pendingWrite {
	if t.lease != nil {
		return pendingWrite{}
	}
	return pendingWrite{key: t.Call.Key.Name, at: t.AdmittedAt, expires: t.AdmittedAt.Add(p.inFlightTimeout()), t: &t, o: o}
}

// pendingRelease is the give-back of the slots of l never handed out, l
// being no longer the Pacer's (none will be); the zero pendingWrite when l
// is nil.
func (p *Pacer) pendingRelease(l *lease) pendingWrite {
	if l == nil {
		return pendingWrite{}
	}
	return pendingWrite{key: l.key, at: l.at, expires: l.until.Add(p.inFlightTimeout()), slots: l.unused()}
}

// commitUnknown says whether a transaction that failed with err may have
// committed all the same: the database did not answer (see
// ledger.ErrUnavailable). One that failed otherwise was rolled back.
func commitUnknown(err error) bool {
	return errors.Is(err, ledger.ErrUnavailable)
}

// retryable says whether a transaction that failed with err failed for
// the database's absence or its caller leaving, not for what it wrote:
// the same writes may succeed in another.
func retryable(err error) bool {
	return errors.Is(err, ledger.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// keepPending keeps ws for their keys' next transactions in this process;
// zero ones are skipped. An outcome replaces the one pending of the same
// attempt, if any.
func (p *Pacer) keepPending(ws ...pendingWrite) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range ws {
		if w.key == "" {
			continue
		}
		if p.pending == nil {
			p.pending = map[string][]*pendingWrite{}
		}
		list := p.pending[w.key]
		if w.t != nil {
			list = slices.DeleteFunc(list, func(k *pendingWrite) bool { return k.t != nil && k.t.ID == w.t.ID })
		}
		p.pending[w.key] = append(list, &w)
		p.armPending(w.key)
	}
}

// pendingRetry is how long after a write became pending a transaction of
// its own writes it, when none of its key's came meanwhile in this
// process (a key called no more would otherwise keep it until Close);
// again as long after each such transaction that fails.
const pendingRetry = time.Second

// armPending sets the timer that writes key's pending writes, unless it
// is set or the Pacer has closed. p.mu is held.
func (p *Pacer) armPending(key string) {
	if p.closed || p.pendingTimed[key] {
		return
	}
	if p.pendingTimed == nil {
		p.pendingTimed = map[string]bool{}
	}
	p.pendingTimed[key] = true
	p.afterFunc()(pendingRetry, p.timerFunc(func() { p.writePendingAlone(key) }))
}

// writePendingAlone writes key's pending writes, if any are left, in a
// transaction of its own; when that fails, its timer is set again.
func (p *Pacer) writePendingAlone(key string) {
	p.mu.Lock()
	delete(p.pendingTimed, key)
	left := unwritten(p.pending[key])
	p.mu.Unlock()
	if !left || p.update(context.Background(), func(ledger.Tx) error { return nil }, key) == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if unwritten(p.pending[key]) {
		p.armPending(key)
	}
}

// takePending returns the pending writes of keys not written yet, oldest
// first, for a transaction to write (see writePending); they stay pending
// until it ends (see pendingEnded). Those expired by now, of any key, are
// forgotten.
func (p *Pacer) takePending(keys []string) []*pendingWrite {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pending) == 0 {
		return nil
	}
	now := p.now()
	for key, list := range p.pending {
		list = slices.DeleteFunc(list, func(w *pendingWrite) bool { return !now.Before(w.expires) })
		if len(list) == 0 {
			delete(p.pending, key)
		} else {
			p.pending[key] = list
		}
	}
	var out []*pendingWrite
	for _, key := range keys {
		for _, w := range p.pending[key] {
			if !w.written {
				out = append(out, w)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b *pendingWrite) int { return a.at.Compare(b.at) })
	return out
}

// writePending makes each of ws in tx. It changes nothing in memory, so
// that a transaction run again writes the same.
func (p *Pacer) writePending(tx ledger.Tx, ws []*pendingWrite) error {
	for _, w := range ws {
		if w.slots != nil {
			if err := tx.Release(w.slots.key, w.slots.first, w.slots.last); err != nil {
				return err
			}
			continue
		}
		open, err := stillOpen(tx, *w.t)
		if err != nil {
			return err
		}
		if !open {
			continue // the transaction that left it committed after all, or a retry of Done did
		}
		if _, err := p.record(tx, *w.t, w.o); err != nil {
			return err
		}
	}
	return nil
}

// pendingEnded ends ws, which a transaction that ended with err (nil when
// it committed) was to write: written when it committed, or when it
// failed otherwise than for the database's absence or its caller leaving
// (given up); kept otherwise. The calls waiting on a key whose outcome was
// recorded are woken.
func (p *Pacer) pendingEnded(ws []*pendingWrite, err error) {
	if len(ws) == 0 || err != nil && retryable(err) {
		return
	}
	p.mu.Lock()
	for _, w := range ws {
		w.written = true
	}
	p.mu.Unlock()
	if err != nil {
		return
	}
	for _, w := range ws {
		if w.t != nil {
			p.signal(w.key)
		}
	}
}

// dropPending forgets the pending outcome of t, and says whether there
// was one, written since or not: Done records it itself, unless it is.
func (p *Pacer) dropPending(t Ticket) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := t.Call.Key.Name
	list := p.pending[key]
	i := slices.IndexFunc(list, func(w *pendingWrite) bool { return w.t != nil && w.t.ID == t.ID })
	if i < 0 {
		return false
	}
	if list = slices.Delete(list, i, i+1); len(list) == 0 {
		delete(p.pending, key)
	} else {
		p.pending[key] = list
	}
	return true
}

// unwritten says whether list holds a write not written yet. p.mu is
// held.
func unwritten(list []*pendingWrite) bool {
	return slices.ContainsFunc(list, func(w *pendingWrite) bool { return !w.written })
}

// pendingKeys adds to held the keys with writes pending. p.mu is held.
func (p *Pacer) pendingKeys(held map[string]bool) {
	for key, list := range p.pending {
		if unwritten(list) {
			held[key] = true
		}
	}
}

// stillOpen says whether t's attempt is unfinished in tx.
func stillOpen(tx ledger.Tx, t Ticket) (bool, error) {
	st, err := tx.AttemptState(t.Call.Key.Name, t.ID)
	return st == ledger.Admitted || st == ledger.Reserved, err
}

// recordOnce is record, unless retried (an earlier Done of t failed) and
// t's outcome is in tx already: then its plan records nothing, and holds
// what the outcome says with the key's state as it is.
func (p *Pacer) recordOnce(tx ledger.Tx, t Ticket, o Outcome, retried bool) (outcomePlan, error) {
	if retried {
		open, err := stillOpen(tx, t)
		if err != nil {
			return outcomePlan{}, err
		}
		if !open {
			rd := o.Reading
			if rd == nil {
				rd = &ratelimit.Reading{}
			}
			ks, err := tx.KeyState(t.Call.Key.Name)
			return outcomePlan{res: Result{State: classify(o, rd)}, keyState: &ks}, err
		}
	}
	return p.record(tx, t, o)
}
