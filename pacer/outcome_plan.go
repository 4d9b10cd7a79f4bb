package pacer

import (
	"cmp"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// An outcomePlan is what recording one answer changes, as a value: the
// writes its rules decided (see record), what Done tells the caller, and
// what changes in memory once the transaction committed. A rule returns
// the part of the plan it decided; record applies each part to the
// transaction and adds it to the whole (recorder.applyPart). The zero
// outcomePlan changes nothing.
type outcomePlan struct {
	observations []ledger.ObservationRecord // every observation of the answer, with its context
	seen         []seenChange               // policies to put or delete, in order
	forget       *pathsBefore               // route failures (and their gates) to forget; nil: none
	path         *ledger.PathState          // the route's failures, to record; nil: unchanged
	gates        []ledger.Gate              // gates to close, in order (a later one on the same scope only lengthens it)
	warnings     []ledger.Warning           // warnings to raise, in order
	keyState     *ledger.KeyState           // the key's pacing state, to record; nil: unchanged
	finish       *finishing                 // the attempt's end; nil: none
	release      *slotRange                 // a lease's unused slots, to give back; nil: none

	res Result // what the caller hears: its State, Warnings, DoNotRetry and RetryIn

	// endLease is the lease that ends once the transaction committed,
	// when only what the transaction read says it ends (see
	// endLeaseBefore); nil when none. Nothing writes it: Done does.
	endLease *lease
	// endKeyLease is the key whose lease, whichever is current once the
	// transaction committed, ends then: the answer is news (see
	// bringsNews); "" when none.
	endKeyLease string
}

// A seenChange puts a policy the upstream announced (or one inferred), or
// deletes it.
type seenChange struct {
	policy ledger.SeenPolicy
	delete bool // delete the policy of policy's key, name, unit and partition
}

func putSeen(k ledger.SeenPolicy) seenChange { return seenChange{policy: k} }

func deleteSeen(k ledger.SeenPolicy) seenChange { return seenChange{policy: k, delete: true} }

// A finishing is the end of an attempt: a lease's slot, or a call
// admitted by a transaction of its own.
type finishing struct {
	attempt ledger.Attempt
	slot    bool
}

// pathsBefore is the route failures of key last seen before a time.
type pathsBefore struct {
	key    string
	before time.Time
}

// A slotRange is the slots first to last of a lease of key; first > last
// is none.
type slotRange struct {
	key         string
	first, last int64
}

// add adds the later part of a plan to p: its writes after p's, its
// warnings after p's, the longer wait and either's request not to retry.
// What part sets alone (the key's state, the route's, the attempt's end)
// replaces p's.
func (p *outcomePlan) add(part outcomePlan) {
	p.observations = append(p.observations, part.observations...)
	p.seen = append(p.seen, part.seen...)
	p.gates = append(p.gates, part.gates...)
	p.warnings = append(p.warnings, part.warnings...)
	p.forget = cmp.Or(part.forget, p.forget)
	p.path = cmp.Or(part.path, p.path)
	p.keyState = cmp.Or(part.keyState, p.keyState)
	p.finish = cmp.Or(part.finish, p.finish)
	p.release = cmp.Or(part.release, p.release)
	p.endLease = cmp.Or(part.endLease, p.endLease)
	p.endKeyLease = cmp.Or(part.endKeyLease, p.endKeyLease)
	if part.res.State != "" {
		p.res.State = part.res.State
	}
	p.res.Warnings = append(p.res.Warnings, part.res.Warnings...)
	p.res.DoNotRetry = p.res.DoNotRetry || part.res.DoNotRetry
	p.res.RetryIn = max(p.res.RetryIn, part.res.RetryIn)
}

// apply writes plan in tx, in this order: observations, policies, route
// failures, gates, warnings, the key's state, the attempt's end, the
// slots given back. It changes nothing in memory, and writes the same
// whenever tx's function runs again with the same plan.
func apply(tx ledger.Tx, plan outcomePlan) error {
	for _, rec := range plan.observations {
		if err := tx.AddObservation(rec); err != nil {
			return err
		}
	}
	for _, c := range plan.seen {
		k := c.policy
		var err error
		if c.delete {
			err = tx.DeleteSeenPolicy(k.Key, k.Policy, k.Unit, k.Partition)
		} else {
			err = tx.PutSeenPolicy(k)
		}
		if err != nil {
			return err
		}
	}
	if err := applyPaths(tx, plan); err != nil {
		return err
	}
	for _, g := range plan.gates {
		if err := tx.PutGate(g); err != nil {
			return err
		}
	}
	for _, w := range plan.warnings {
		if err := tx.AddWarning(w); err != nil {
			return err
		}
	}
	if plan.keyState != nil {
		if err := tx.PutKeyState(*plan.keyState); err != nil {
			return err
		}
	}
	if err := applyFinish(tx, plan.finish); err != nil {
		return err
	}
	if r := plan.release; r != nil {
		return tx.Release(r.key, r.first, r.last)
	}
	return nil
}

// applyPaths forgets the old route failures plan says to, and records the
// route's.
func applyPaths(tx ledger.Tx, plan outcomePlan) error {
	if f := plan.forget; f != nil {
		if err := tx.ForgetPaths(f.key, f.before); err != nil {
			return err
		}
	}
	if plan.path == nil {
		return nil
	}
	return tx.PutPathState(*plan.path)
}

// applyFinish records f, when not nil.
func applyFinish(tx ledger.Tx, f *finishing) error {
	switch {
	case f == nil:
		return nil
	case f.slot:
		return tx.FinishReserved(f.attempt)
	}
	a := f.attempt
	return tx.FinishAttempt(a.ID, a.State, a.Reason, a.Status, a.SentAt, a.AnsweredAt)
}

// A recorder applies the parts of a plan to a transaction as its rules
// make them, and keeps the whole.
type recorder struct {
	tx   ledger.Tx
	plan outcomePlan
}

// applyPart applies part to the transaction and adds it to the plan. Each part
// is applied before the next rule reads: the hidden-limit and bound rules
// weigh the policies as the store merged what earlier parts put (a put
// keeps what the store held of a field the observation lacks).
func (r *recorder) applyPart(part outcomePlan, err error) error {
	if err != nil {
		return err
	}
	r.plan.add(part)
	return apply(r.tx, part)
}
