package pacer

import (
	"context"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// advise evaluates a next call by c's caller at now, given the key's
// pacing state ks, ignoring the spacing of the call just made and the
// calls in flight: the budgets that hold, the tightest, and advice.
func (p *Pacer) advise(tx ledger.Tx, c Call, now time.Time, ks ledger.KeyState) ([]Budget, *Budget, Advice, error) {
	snap, err := p.load(tx, c, now, &ks, false)
	if err != nil {
		return nil, nil, Advice{}, err
	}
	if countsInFlight(c.Key, snap.seen) {
		// A budget in concurrent-requests shows the calls in flight (their
		// count only: the margin ignores them here, as it did).
		f, err := tx.Flight(c.Key.Name, now)
		if err != nil {
			return nil, nil, Advice{}, err
		}
		snap.flight.Count, snap.noFlightWait = f.Count, true
	}
	snap.ks.LastAdmitAt, snap.ks.Interval = time.Time{}, 0
	snap.bytes = 0 // a next call carries what it carries: the advice says what is left
	d, err := decide(snap)
	if err != nil {
		return nil, nil, Advice{}, err
	}
	return d.budgets, d.binding, adviceFor(d), nil
}

// adviceFor turns a decision about a next call into advice a caller can
// act on, that agrees with the action. A pause (for a second or more)
// asks for the decision's wait, as RetryAfter does, and says why; a wait
// under a second is no pause, and says so; continue says what is left,
// never that nothing is. reason.Advice words it.
func adviceFor(d decision) Advice {
	b := d.binding
	switch {
	case !d.admit && d.exhaust && d.wait >= time.Second:
		return Advice{Action: Pause, RetryAfter: d.wait, Why: d.reason}
	case d.slow:
		return Advice{Action: SlowDown, Why: d.spread}
	case !d.admit && d.exhaust:
		return Advice{Action: SlowDown, Why: d.reason} // it ends in under a second
	case b != nil && b.Unit == ratelimit.ConcurrentRequests && b.Remaining == 0:
		why, _ := unitsLeft(b)
		return Advice{Action: SlowDown, Why: why}
	case b != nil && b.Remaining > 0:
		if why, ok := unitsLeft(b); ok {
			return Advice{Action: Continue, Why: why}
		}
		return Advice{Action: Continue, Why: reason.Reason{Kind: reason.CallsLeft, Left: b.Remaining, For: budgetReset(b)}}
	}
	return Advice{Action: Continue, Why: reason.Reason{Kind: reason.NoLimit}}
}

// budgetReset is how long what b says is left holds: its reset, or its
// whole window when nothing in it has been spent yet.
func budgetReset(b *Budget) time.Duration {
	if b.Reset > 0 {
		return b.Reset
	}
	return b.Window
}

// A KeyStatus is everything known about one key's budget, for planning,
// as one caller would meet it.
type KeyStatus struct {
	Key      string        // the key's name
	Local    []Budget      // the documented policies, counted over every caller and process
	Upstream []Budget      // every policy the upstream announced or a refusal revealed
	Gates    []ledger.Gate // the key's closed gates, the latest to open first
	// RouteGates are the closed gates of single routes of the key (a
	// route's backoff or circuit after server errors without a signal),
	// the latest to open first: calls on other routes go on.
	RouteGates []ledger.Gate
	Warnings   []ledger.Warning   // raised in the last hour
	InFlight   int                // calls admitted and not yet answered, in every process
	Reserves   []keystore.Reserve // the key's reservations
	Binding    *Budget            // the tightest budget; nil when none is known
	Advice     Advice             // what the caller should do next
}

// Status reports k's budget as caller would meet it now. It never sends
// anything upstream; it writes only what this process's routine answers
// taught the key and did not write yet (see learned), so that it reports
// them too, when it can.
func (p *Pacer) Status(ctx context.Context, k *keystore.Key, caller string) (KeyStatus, error) {
	st := KeyStatus{Key: k.Name, Reserves: k.Reserves}
	// When that write fails, the file's observations are older: they project no
	// more than the newer ones would.
	_ = p.writeLearnedNow(ctx, k.Name)
	now := p.now()
	err := p.db.View(ctx, func(tx ledger.ReadTx) error {
		snap, err := p.load(tx, Call{Key: k, Caller: caller}, now, nil, true)
		if err != nil {
			return err
		}
		for _, g := range snap.gates {
			if g.Scope == "" {
				st.Gates = append(st.Gates, g)
			} else {
				st.RouteGates = append(st.RouteGates, g)
			}
		}
		st.InFlight = snap.flight.Count
		if st.Warnings, err = tx.Warnings(k.Name, now.Add(-time.Hour)); err != nil {
			return err
		}
		snap.noFlightWait = true // a budget in concurrent-requests shows them; nothing waits
		snap.ks.LastAdmitAt, snap.ks.Interval = time.Time{}, 0
		d, err := decide(snap)
		if err != nil {
			return err
		}
		for _, b := range d.budgets {
			switch {
			case b.Source == "local":
				st.Local = append(st.Local, b)
			case b.Observed.IsZero():
				// The sliding-window twin of an upstream policy: shown through
				// its observation, which it completed when r was unknown.
			default:
				st.Upstream = append(st.Upstream, b)
			}
		}
		st.Binding, st.Advice = d.binding, adviceFor(d)
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("pacer: status %s: %w", k.Name, err)
	}
	return st, nil
}
