package pacer

import (
	"context"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/state"
)

// advise evaluates a next call by c's caller at now, ignoring the spacing
// of the call just made: the budgets that hold, the tightest, and advice.
func (p *Pacer) advise(tx *state.Tx, c Call, now time.Time) ([]Budget, *Budget, Advice, error) {
	snap, err := p.load(tx, c, now)
	if err != nil {
		return nil, nil, Advice{}, err
	}
	snap.inFlight = 0
	snap.ks.LastAdmitAt, snap.ks.Interval = time.Time{}, 0
	d, err := decide(snap)
	if err != nil {
		return nil, nil, Advice{}, err
	}
	return d.budgets, d.binding, adviceFor(d), nil
}

// adviceFor turns a decision about a next call into advice.
func adviceFor(d decision) Advice {
	b := d.binding
	switch {
	case !d.admit && d.exhaust && d.wait >= time.Second:
		return Advice{Action: Pause, RetryAfter: d.wait, Reason: sentence(d.reason) + fmt.Sprintf(" Call again after %s, or use quota_status.", seconds(d.wait))}
	case d.slow || (!d.admit && d.exhaust):
		return Advice{Action: SlowDown, Reason: slowReason(b, d)}
	case b != nil && b.Remaining >= 0:
		return Advice{Action: Continue, Reason: fmt.Sprintf("You can make %d more calls in the next %s under policy '%s'.",
			b.Remaining, seconds(b.Reset), b.Policy)}
	}
	return Advice{Action: Continue, Reason: "No limit is known to bind this key right now."}
}

func slowReason(b *Budget, d decision) string {
	if b != nil && b.Remaining >= 0 && b.Limit > 0 {
		r := fmt.Sprintf("Only %d of %d calls are left under policy '%s'", b.Remaining, b.Limit, b.Policy)
		if b.Reset > 0 {
			r += fmt.Sprintf(" for the next %s", seconds(b.Reset))
		}
		if b.Remaining > 0 && b.Reset > 0 {
			r += fmt.Sprintf("; spread them out, about one every %s", seconds(b.Reset/time.Duration(b.Remaining)))
		}
		return r + "."
	}
	return sentence(d.reason)
}

// sentence capitalises s and ends it with a full stop.
func sentence(s string) string {
	if s == "" {
		return s
	}
	if s[0] >= 'a' && s[0] <= 'z' {
		s = string(s[0]-'a'+'A') + s[1:]
	}
	if s[len(s)-1] != '.' {
		s += "."
	}
	return s
}

// A KeyStatus is everything known about one key's budget, for planning.
type KeyStatus struct {
	Key      string
	Local    []Budget // the documented policies, counted over every caller and process
	Upstream []Budget // every policy the upstream announced or a refusal revealed
	Gates    []state.Gate
	Warnings []state.Warning // raised in the last hour
	InFlight int
	Reserves []keystore.Reserve
	Binding  *Budget
	Advice   Advice
}

// Status reports k's budget as caller would meet it now. It reads the
// state file only: it never sends anything upstream.
func (p *Pacer) Status(ctx context.Context, k *keystore.Key, caller string) (KeyStatus, error) {
	st := KeyStatus{Key: k.Name, Reserves: k.Reserves}
	now := p.now()
	err := p.db.View(ctx, func(tx *state.Tx) error {
		snap, err := p.load(tx, Call{Key: k, Caller: caller}, now)
		if err != nil {
			return err
		}
		st.Gates, st.InFlight = snap.gates, snap.inFlight
		if st.Warnings, err = tx.Warnings(k.Name, now.Add(-time.Hour)); err != nil {
			return err
		}
		snap.inFlight = 0
		snap.ks.LastAdmitAt, snap.ks.Interval = time.Time{}, 0
		d, err := decide(snap)
		if err != nil {
			return err
		}
		for _, b := range d.budgets {
			if b.Source == "local" {
				st.Local = append(st.Local, b)
			} else if b.Observed.IsZero() {
				continue // the sliding-window twin of an upstream policy: shown through its observation
			} else {
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
