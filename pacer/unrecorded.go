package pacer

import (
	"context"
	"errors"
	"slices"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// An attempt that went out but whose outcome the state database did not
// take (it went away, or was past its bound) still counts in its window:
// it stays admitted in the log. Its outcome is not lost with the
// transaction, though: it is kept here and recorded by the key's next
// transaction in this process, once the database answers again. Were it
// dropped, the attempt would hold the key until its lease ran out (two
// minutes): as a probe, every call waits for its answer; in any case, it
// counts as in flight. An outcome is recorded once, whichever of that
// transaction and a retry of Done commits first.

// unrecordedOutcome is the outcome of one attempt Done could not record.
type unrecordedOutcome struct {
	t Ticket
	o Outcome
	// done: a later transaction recorded it, or found it recorded. It is
	// remembered until its lease runs out, so that a retry of Done after
	// that transaction checks before it records.
	done bool
}

// keepUnrecorded remembers t's outcome o, which Done could not record
// because the database did not answer. An attempt from a lease is
// recorded through its own path, and an error other than the database's
// absence would fail the next transaction too: neither is kept.
func (p *Pacer) keepUnrecorded(t Ticket, o Outcome, err error) {
	if t.lease != nil || !errors.Is(err, ledger.ErrUnavailable) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unrecorded == nil {
		p.unrecorded = map[string]map[int64]unrecordedOutcome{}
	}
	m := p.unrecorded[t.Call.Key.Name]
	if m == nil {
		m = map[int64]unrecordedOutcome{}
		p.unrecorded[t.Call.Key.Name] = m
	}
	m[t.ID] = unrecordedOutcome{t: t, o: o}
}

// dropUnrecorded forgets the kept outcome of t, and says whether there
// was one, recorded since or not: Done records it itself, unless it is.
func (p *Pacer) dropUnrecorded(t Ticket) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.unrecorded[t.Call.Key.Name]
	if _, ok := m[t.ID]; !ok {
		return false
	}
	delete(m, t.ID)
	if len(m) == 0 {
		delete(p.unrecorded, t.Call.Key.Name)
	}
	return true
}

// takeUnrecorded returns the kept outcomes of keys not recorded yet,
// oldest first, leaving them kept until a transaction that records them
// commits. Those whose lease ran out by now, of any key, are forgotten:
// the attempt no longer counts as in flight, and a probe no longer holds
// its key.
func (p *Pacer) takeUnrecorded(keys []string) []unrecordedOutcome {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.unrecorded) == 0 {
		return nil
	}
	now := p.now()
	for key, m := range p.unrecorded {
		for id, u := range m {
			if !now.Before(u.t.AdmittedAt.Add(p.inFlightTimeout())) {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(p.unrecorded, key)
		}
	}
	var out []unrecordedOutcome
	for _, key := range keys {
		for _, u := range p.unrecorded[key] {
			if !u.done {
				out = append(out, u)
			}
		}
	}
	slices.SortFunc(out, func(a, b unrecordedOutcome) int { return a.t.AdmittedAt.Compare(b.t.AdmittedAt) })
	return out
}

// recordedNow notes that the kept outcomes us need no recording any more:
// a transaction that committed recorded them (or found them recorded).
func (p *Pacer) recordedNow(us []unrecordedOutcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range us {
		if m := p.unrecorded[u.t.Call.Key.Name]; m != nil {
			if k, ok := m[u.t.ID]; ok {
				k.done = true
				m[u.t.ID] = k
			}
		}
	}
}

// recordUnrecorded records in tx each of us still unrecorded there. It
// changes nothing in memory, so that a transaction run again records the
// same.
func (p *Pacer) recordUnrecorded(tx ledger.Tx, us []unrecordedOutcome) error {
	for _, u := range us {
		open, err := stillOpen(tx, u.t)
		if err != nil {
			return err
		}
		if !open {
			continue // an earlier try committed after all, or a retry of Done
		}
		if _, err := p.record(tx, u.t, u.o); err != nil {
			return err
		}
	}
	return nil
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

// keptFailed forgets the kept outcomes us when the transaction that was
// to record them failed otherwise than for the database's absence or its
// caller leaving: one that cannot be recorded must not fail every later
// transaction of its key.
func (p *Pacer) keptFailed(us []unrecordedOutcome, err error) {
	if errors.Is(err, ledger.ErrUnavailable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	p.recordedNow(us)
}
