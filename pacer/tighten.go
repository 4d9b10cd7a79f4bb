package pacer

import (
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// An observation's effective window t is whole seconds, rounded up by
// the upstream (and Retry-After-like resets are often measured against a
// Date floored to the second): read alone, it ends up to a second or two
// after the upstream's window does, and everything that waits for it
// waits that much longer. tightenReset ends it as early as what else is known
// proves it ends:
//
//   - An earlier observation of the same window ends it too: one of the
//     same policy whose r has fallen since by exactly the sends made
//     since (so no slot was freed and no window began in between). The
//     earliest such end is kept: the first answers of a window bound its
//     end within a round trip, the last ones within a second.
//   - When r is what the log leaves of the policy's quota (q minus the
//     sends the log holds in the policy's window up to the observing
//     request), the upstream's window holds exactly the log's sends, so
//     it frees when the oldest of them leaves the log's window (with its
//     margin): a sliding window then, a fixed one no later.
//
// Neither ever ends an observation later than its own t says. admitted
// and basis are when the observing request was admitted and sent; v's
// log holds the sends.
func tightenReset(v outcomeView, k *keystore.Key, ob ratelimit.Observation, receivedAt, admitted, basis time.Time,
	prev *ledger.SeenPolicy, ks ledger.KeyState) (ratelimit.Observation, error) {
	if !ob.HasRemaining || !ob.HasReset || ob.Unit != ratelimit.Requests || ob.Shape == ratelimit.ShapeLeaky {
		return ob, nil // a leaky bucket's t is a leak, not a window's end
	}
	end := receivedAt.Add(ob.Reset)
	log := &basisLog{v: v, key: k.Name, basis: basis, later: -1}
	// (r falls by at least this request: one that did not fall, or a
	// quota r reaches, needs no reading of the log.)
	if prev != nil && prev.HasRemaining && prev.HasReset && !prev.Hidden && prev.BasisAt.Before(admitted) &&
		ob.Remaining < prev.Remaining && (!prev.HasQuota || !ob.HasQuota || prev.Quota == ob.Quota) {
		n, err := log.sendsBefore(prev.BasisAt, prev.Remaining-ob.Remaining)
		if err != nil {
			return ob, err
		}
		if n == prev.Remaining-ob.Remaining {
			end = minTime(end, prev.ReceivedAt.Add(prev.Reset))
		}
	}
	if q, w, ok := quotaWindow(k, ob); ok && ob.Remaining < q {
		m := latencyMargin(ks, w)
		since := basis.Add(-w - m)
		n, err := log.sendsBefore(since, q-ob.Remaining)
		if err != nil {
			return ob, err
		}
		if n > 0 && n == q-ob.Remaining {
			oldest, err := v.Nth(k.Name, since, 1)
			if err != nil {
				return ob, err
			}
			end = minTime(end, oldest.Add(w+m))
		}
	}
	ob.Reset = max(end.Sub(receivedAt), 0)
	return ob, nil
}

// A basisLog counts a key's sends in the log from a time to an answer's
// basis, for tightenReset, which compares them with a count the upstream
// gave.
type basisLog struct {
	v     outcomeView
	key   string
	basis time.Time
	later int // the sends admitted after basis, once read; -1 before
}

// sendsBefore returns how many sends the log holds after since and up to
// l's basis, when that can be want; -1 when it cannot: they are no more
// than all the sends after since, so when those are fewer than want, the
// sends after the basis need no read (a round trip, on PostgreSQL).
func (l *basisLog) sendsBefore(since time.Time, want int64) (int64, error) {
	all, err := l.v.Count(l.key, since)
	if err != nil || int64(all) < want {
		return -1, err
	}
	if l.later < 0 {
		if l.later, err = l.v.Count(l.key, l.basis); err != nil {
			return -1, err
		}
	}
	return int64(all - l.later), nil
}

// quotaWindow returns the quota and window of the policy ob speaks of:
// its own when it announced both, else those of the documented policy of
// the same name, or of the same quota when it named no window.
func quotaWindow(k *keystore.Key, ob ratelimit.Observation) (q int64, w time.Duration, ok bool) {
	if ob.HasQuota && ob.Window > 0 {
		return ob.Quota, ob.Window, true
	}
	for _, p := range k.Policies {
		if !requests(p.Unit) || p.Quota <= 0 || p.Window <= 0 {
			continue
		}
		if p.Name == ob.Policy && (!ob.HasQuota || ob.Quota == p.Quota) && (ob.Window == 0 || ob.Window == p.Window) {
			return p.Quota, p.Window, true
		}
	}
	for _, p := range k.Policies {
		if !requests(p.Unit) || p.Quota <= 0 || p.Window <= 0 {
			continue
		}
		if ob.HasQuota && ob.Quota == p.Quota && ob.Window == 0 {
			return p.Quota, p.Window, true
		}
	}
	return 0, 0, false
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
