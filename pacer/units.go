package pacer

import (
	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A policy counts one of the draft's units (RateLimit-Policy's qu), and
// is spent by what that unit counts:
//
//   - requests: one per call admitted, over the sliding-window log (see
//     windowedBudgets);
//   - content-bytes: the bytes each request carries, its body's length
//     as known before it is sent (Call.Bytes), summed over the same log:
//     at most q bytes are admitted in any w, and a call waits until the
//     window has room for its whole body;
//   - concurrent-requests: the calls in flight (admitted and not yet
//     ended, by every caller and process), at most q at once: a slot is
//     given back when a call ends, never by a timer, so an observation
//     of such a policy never expires into a probe.

// byteBudget is a budget in content-bytes: a documented policy or an
// upstream one that announced q and w in content-bytes, counted over the
// bytes of the log.
type byteBudget struct {
	windowed
	never bool // the call carries more than the whole quota: it never fits
}

// byteWindows returns k's documented policies in content-bytes and those
// of known that announced q and w in content-bytes.
func byteWindows(k *keystore.Key, known []ledger.SeenPolicy) []policyWindow {
	var ps []policyWindow
	for _, p := range k.Policies {
		if p.Unit == ratelimit.ContentBytes {
			ps = append(ps, policyWindow{p.Name, "", p.Quota, p.Window, "local", false})
		}
	}
	for _, kn := range known {
		if kn.Unit == ratelimit.ContentBytes && kn.HasQuota && kn.Window > 0 {
			ps = append(ps, policyWindow{kn.Policy, kn.Partition, kn.Quota, kn.Window, string(kn.Shape), kn.Hidden})
		}
	}
	return ps
}

// need is what a call must find left of a budget in unit u to go: its
// bytes in content-bytes (at least one: an exhausted budget holds every
// call back, whatever it carries), one call otherwise.
func (s snapshot) need(u ratelimit.Unit) int64 {
	if u == ratelimit.ContentBytes {
		return max(s.bytes, 1)
	}
	return 1
}

// byteBudgets returns the key's budgets in content-bytes, each counted
// over the bytes the log's admissions carried in its window, and whether
// this call fits in each.
func (s snapshot) byteBudgets() ([]byteBudget, error) {
	var out []byteBudget
	for _, p := range byteWindows(s.key, s.applicable()) {
		m := s.margin(p.w)
		since := s.now.Add(-p.w - m)
		used, err := s.log.Bytes(since)
		if err != nil {
			return nil, err
		}
		if s.replaced(since) {
			used -= s.bytes // the attempt this call replaces, with the same body, was never sent
		}
		bb := byteBudget{windowed: windowed{Budget: Budget{Policy: p.name, Unit: ratelimit.ContentBytes, Partition: p.partition,
			Limit: p.q, Used: used, Window: p.w, Source: p.source, Hidden: p.hidden}}}
		bb.avail = p.q - used
		bb.Remaining = max(bb.avail, 0)
		if used > 0 {
			win, err := s.log.Window(since)
			if err != nil {
				return nil, err
			}
			if !win.Oldest.IsZero() {
				bb.Reset = min(win.Oldest.Add(p.w+m).Sub(s.now), p.w)
			}
		}
		need := s.need(ratelimit.ContentBytes)
		switch {
		case need > p.q:
			bb.never = true
			bb.freeAt = s.now.Add(p.w)
		case bb.avail < need:
			// The call waits for this many of the window's bytes to
			// leave it.
			e, err := s.log.NthByte(since, used+need-p.q)
			if err != nil {
				return nil, err
			}
			if e.IsZero() {
				e = s.now
			}
			bb.freeAt = e.Add(p.w + m)
		}
		out = append(out, bb)
	}
	return out, nil
}

// byteConstraint is what a byte budget that this call does not fit in
// asks of it.
func (s snapshot) byteConstraint(bb byteBudget) constraint {
	if bb.never {
		return constraint{wait: bb.freeAt.Sub(s.now), source: bb.Policy, exhaust: true, never: true,
			reason: reason.Reason{Kind: reason.BytesNever, Policy: bb.Policy, Carries: s.bytes, Limit: bb.Limit, Window: bb.Window}}
	}
	return constraint{wait: bb.freeAt.Sub(s.now), source: bb.Policy, exhaust: true, keyWide: bb.avail <= 0,
		reason: reason.Reason{Kind: reason.BytesShort, Policy: bb.Policy, Left: bb.Remaining, Limit: bb.Limit, Window: bb.Window,
			Carries: max(s.bytes, 0)}}
}

// concurrency is the budget of an upstream policy in concurrent-requests,
// and what it asks of this call: a slot of its quota is taken by every
// call in flight and given back when the call ends. Without a quota, the
// r an answer said holds: r more could start while the call it answered
// was still in flight, so at least r+1 may be in flight at once — the
// most it allows until an answer says more.
func (s snapshot) concurrency(k ledger.SeenPolicy) (Budget, constraint) {
	b := Budget{Policy: k.Policy, Unit: ratelimit.ConcurrentRequests, Partition: k.Partition, Limit: k.Quota,
		Used: int64(s.flight.Count), Remaining: -1, Source: string(k.Shape), Observed: k.ReceivedAt, Hidden: k.Hidden}
	limit := int64(-1)
	switch {
	case k.HasQuota:
		limit = max(k.Quota, 1) // a call at a time at least: its answer may say more
		b.Limit = limit
	case k.HasRemaining:
		limit = max(k.Remaining, 0) + 1
	}
	var c constraint
	if limit >= 0 {
		b.Remaining = max(limit-int64(s.flight.Count), 0)
		if b.Remaining == 0 && !s.noFlightWait {
			c = s.inFlightConstraint(b)
		}
	}
	return b, c
}

// concurrencyBudgets returns the budgets of the key's documented
// policies in concurrent-requests.
func (s snapshot) concurrencyBudgets() ([]Budget, []constraint) {
	var bs []Budget
	var cs []constraint
	for _, p := range s.key.Policies {
		if p.Unit != ratelimit.ConcurrentRequests {
			continue
		}
		b := Budget{Policy: p.Name, Unit: ratelimit.ConcurrentRequests, Limit: p.Quota, Used: int64(s.flight.Count),
			Remaining: max(p.Quota-int64(s.flight.Count), 0), Source: "local"}
		bs = append(bs, b)
		if b.Remaining == 0 && !s.noFlightWait {
			cs = append(cs, s.inFlightConstraint(b))
		}
	}
	return bs, cs
}

// inFlightConstraint holds a call back until a call in flight ends: a
// re-check, woken early when one ends in this process.
func (s snapshot) inFlightConstraint(b Budget) constraint {
	why := reason.Reason{Kind: reason.ConcurrencyFull, Policy: b.Policy, Limit: max(b.Limit, 0), InFlight: int64(s.flight.Count)}
	return constraint{wait: Poll, poll: true, source: b.Policy, reason: why}
}

// unitsLeft says what a budget not in requests has left, for advice:
// Left of Limit content-bytes under its policy for what is left of its
// window, or the concurrent requests in flight under it. ok is false for
// a budget in requests (or in a unit mcp-quota does not count), which
// CallsLeft says.
func unitsLeft(b *Budget) (reason.Reason, bool) {
	switch b.Unit {
	case ratelimit.ContentBytes:
		return reason.Reason{Kind: reason.BytesLeft, Policy: b.Policy, Left: b.Remaining, Limit: b.Limit, For: max(budgetReset(b), 0)}, true
	case ratelimit.ConcurrentRequests:
		return reason.Reason{Kind: reason.InFlightOf, Policy: b.Policy, Used: b.Used, Limit: max(b.Limit, 0), Left: b.Remaining}, true
	}
	return reason.Reason{}, false
}

// keyHasBytes reports whether k or what its upstream announced counts
// content-bytes: its calls are never leased (a slot's bytes are not
// known when it is reserved).
func keyHasBytes(k *keystore.Key, known []ledger.SeenPolicy) bool {
	for _, p := range k.Policies {
		if p.Unit == ratelimit.ContentBytes {
			return true
		}
	}
	for _, kn := range known {
		if kn.Unit == ratelimit.ContentBytes {
			return true
		}
	}
	return false
}

// countsInFlight reports whether k or what its upstream announced counts
// concurrent-requests.
func countsInFlight(k *keystore.Key, known []ledger.SeenPolicy) bool {
	for _, p := range k.Policies {
		if p.Unit == ratelimit.ConcurrentRequests {
			return true
		}
	}
	for _, kn := range known {
		if kn.Unit == ratelimit.ConcurrentRequests {
			return true
		}
	}
	return false
}

// requests reports whether a policy in unit u counts calls: the unit
// requests, which a policy that names none counts too.
func requests(u ratelimit.Unit) bool { return u == "" || u == ratelimit.Requests }
