package pacer

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Tuning constants of the decisions. They are the documented defaults;
// the key's own MaxRate, MaxConcurrency and LowWater come from its
// configuration.
const (
	// DefaultValidity is how long an observation without t (and without w)
	// is believed.
	DefaultValidity = 60 * time.Second
	// ProbeJitter bounds the delay added to a probe after an observation
	// expires, so that the clients of one API do not probe together. In a
	// window shorter than probeJitterShare seconds, the bound is that
	// share of the window.
	ProbeJitter = time.Second
	// probeJitterShare is the share of its window (1/40) that a probe's
	// jitter stays under.
	probeJitterShare = 40
	// Poll is how often a waiting call re-checks when it waits for
	// something with no known end (a probe's answer, a free slot).
	Poll = 50 * time.Millisecond
)

// An Action is what a caller is told to do next.
type Action string

// The actions a caller can be advised.
const (
	Continue Action = "continue"  // go on at the current pace
	SlowDown Action = "slow_down" // calls are being spread out: the budget runs low
	Pause    Action = "pause"     // stop; come back after RetryAfter
)

// A Budget is one constraint on a key as a caller sees it at one moment:
// a policy with what is left of it. It is a value; Remaining is a hint,
// not a grant.
type Budget struct {
	Policy    string         // the policy's name
	Unit      ratelimit.Unit // what it counts
	Partition string         // the upstream's partition (pk, resource, bucket); "" when none
	Limit     int64          // q; 0 when unknown
	Used      int64          // sent in the current window, by every caller (windowed budgets)
	Remaining int64          // what this caller may still use now; -1 when unknown
	Reset     time.Duration  // until the effective window ends (upstream) or the oldest send leaves the window (local)
	Window    time.Duration  // w; 0 when unknown
	Source    string         // "local" for a documented policy, else the shape it was read from
	Observed  time.Time      // when the upstream said it; zero for local
	Expired   bool           // the observation is past its effective window
	Hidden    bool           // inferred from a refusal; never announced
	// Counted is set on an upstream policy whose Remaining and Reset come
	// from mcp-quota's own log (its q and w over every send of the key),
	// because the upstream's r is unknown or expired.
	Counted bool
}

// A log is the sliding-window log of a key's admitted attempts, as of the
// snapshot.
type log interface {
	// Count returns how many attempts were admitted after since.
	Count(since time.Time) (int, error)
	// Window returns the count and the oldest of the attempts admitted
	// after since, and their count per caller when the key has
	// reservations.
	Window(since time.Time) (ledger.Window, error)
	// Nth returns the admission time of the n-th oldest attempt admitted
	// after since, or the zero time when there are fewer.
	Nth(since time.Time, n int) (time.Time, error)
	// Bytes returns the bytes the attempts admitted after since carried.
	Bytes(since time.Time) (int64, error)
	// NthByte returns the admission time of the attempt by which those
	// admitted after since carried n bytes, or the zero time.
	NthByte(since time.Time, n int64) (time.Time, error)
}

// snapshot is what a decision is made from.
type snapshot struct {
	now     time.Time
	key     *keystore.Key
	caller  string
	route   string // method and path of the request, to pick partitions
	seen    []ledger.SeenPolicy
	gates   []ledger.Gate
	fair    *fairView // the key's shares: who spent what, who waits (see fair.go); nil when it has none
	ks      ledger.KeyState
	flight  ledger.Flight   // calls in flight, when counted
	claimed map[string]bool // reserve callers with an open claim
	log     log
	delay   delayEstimate // this process's recent delays from admission to send (see sendDelays)
	late    *LateError    // the attempt this call replaces, not sent; nil when none
	bytes   int64         // what the call carries (Call.Bytes), for budgets in content-bytes
	// noFlightWait says the calls in flight are shown in budgets but hold
	// nothing back: a status, not a call.
	noFlightWait bool
}

// A decision says whether a call may go now, and if not, for how long it
// must wait and why.
type decision struct {
	admit   bool
	probe   bool
	wait    time.Duration     // when !admit
	reason  reason.Reason     // why it waits or slows down
	source  string            // what binds: a policy name, "retry-after", "circuit"…
	gate    ledger.GateSource // what closed the gate that binds; "" when no gate binds (a policy named "circuit" is not one)
	limit   OwnLimit          // the pacer's own limit that binds; "" when a policy or a gate binds (a policy named "pace" is not one)
	poll    bool              // wait is a re-check interval, not a known end
	exhaust bool              // the wait is for quota or a gate, not for spacing
	keyWide bool              // the key itself is paused (not this caller alone): slow start follows
	slow    bool              // a budget is below its low-water mark
	spread  reason.Reason     // when slow: the widest spread, which advice says
	spacing time.Duration     // when slow: that spread
	binding *Budget           // the tightest budget
	budgets []Budget
	never   bool // the call can never go as it is (see byteConstraint)
}

// constraint is one reason to wait.
type constraint struct {
	wait    time.Duration
	reason  reason.Reason
	source  string
	gate    ledger.GateSource // the gate's source, for a gate; "" otherwise
	limit   OwnLimit          // the pacer's own limit, for one; "" otherwise
	poll    bool
	exhaust bool
	keyWide bool
	never   bool
}

// decide is the pacer's decision for one call, a pure function of s
// (the log it reads is the sliding window as of s.now). Each step is a
// rule that returns its reasons to wait; the longest of them binds.
func decide(s snapshot) (decision, error) {
	var d decision
	var cs constraints
	cs.add(s.gateRule()...)
	windows, err := s.windowedBudgets()
	if err != nil {
		return d, err
	}
	cs.add(s.windowRule(&d, windows)...)
	// 2b. Fair shares: the principal's cap, and its turn among the
	// principals waiting for the key (see fair.go).
	fcs, err := s.fairConstraints(windows)
	if err != nil {
		return d, err
	}
	cs.add(fcs...)
	windows, ucs, err := s.unitRule(&d, windows)
	if err != nil {
		return d, err
	}
	cs.add(ucs...)
	ocs, err := s.observedRule(&d, windows)
	if err != nil {
		return d, err
	}
	cs.add(ocs...)
	cs.add(s.probeRule(&d)...)
	cs.add(s.safetyRule()...)

	d.binding = tightest(d.budgets)
	if len(cs) == 0 {
		d.admit = true
		return d, nil
	}
	d.waitFor(cs.worst())
	return d, nil
}

// constraints are a decision's reasons to wait, in the order its rules
// found them.
type constraints []constraint

// add keeps the constraints that hold a call back at all.
func (cs *constraints) add(more ...constraint) {
	for _, c := range more {
		if c.wait >= time.Microsecond { // the state file keeps microseconds: less is rounding
			*cs = append(*cs, c)
		}
	}
}

// worst is the constraint that binds: one that can never be met, else the
// longest wait, a wait for quota or a gate before spacing on ties, the
// first found before later ones.
func (cs constraints) worst() constraint {
	worst := cs[0]
	for _, c := range cs[1:] {
		if worst.never {
			break
		}
		if c.never || c.wait > worst.wait || (c.wait == worst.wait && c.exhaust && !worst.exhaust) {
			worst = c
		}
	}
	return worst
}

// waitFor makes d a wait for c: the call is not admitted (and no probe
// goes).
func (d *decision) waitFor(c constraint) {
	d.probe = false
	d.wait, d.reason, d.source, d.poll, d.exhaust, d.keyWide = c.wait, c.reason, c.source, c.poll, c.exhaust, c.keyWide
	d.never, d.gate, d.limit = c.never, c.gate, c.limit
}

// 1. Gates: Retry-After, backoff, an open circuit, abnormal usage.
// A gate binds the whole key, whatever its scope: a policy named by a
// refusal may cover calls we cannot tell apart.
func (s snapshot) gateRule() []constraint {
	var cs []constraint
	for _, g := range s.gates {
		switch g.Scope {
		case "":
			cs = append(cs, constraint{wait: g.Until.Sub(s.now), reason: gateReason(g), source: string(g.Source), gate: g.Source, exhaust: true, keyWide: true})
		case routePartition(s.route):
			// A route's own backoff or circuit: the key is not paused.
			cs = append(cs, constraint{wait: g.Until.Sub(s.now), reason: gateReason(g), source: string(g.Source), gate: g.Source, exhaust: true})
		}
	}
	return cs
}

// 2. Windowed budgets: documented policies, and every upstream policy
// whose q and w are known, counted over the sliding-window log of every
// caller and process sharing the key. Each is one of d's budgets; one
// below its low-water mark spreads calls and makes d slow.
func (s snapshot) windowRule(d *decision, windows []windowed) []constraint {
	var cs []constraint
	for _, wb := range windows {
		d.budgets = append(d.budgets, wb.Budget)
		if wb.avail <= 0 {
			cs = append(cs, constraint{wait: wb.freeAt.Sub(s.now), source: wb.Policy, exhaust: true, keyWide: wb.Used >= wb.Limit,
				reason: reason.Reason{Kind: reason.WindowSpent, Policy: wb.Policy, Limit: wb.Limit, Window: wb.Window, Held: wb.held}})
			continue
		}
		if low(wb.avail, wb.Limit, s.key.LowWater) {
			// Below the low-water mark, calls go at the policy's average
			// pace: what leaves the window is what may enter it.
			d.slow = true
			spacing := wb.Window / time.Duration(wb.Limit)
			why := reason.Reason{Kind: reason.WindowLow, Policy: wb.Policy, Left: wb.avail, Limit: wb.Limit, Spacing: max(spacing, minSpacing(s.key))}
			d.spreadBy(why)
			cs = append(cs, constraint{wait: s.ks.LastAdmitAt.Add(spacing).Sub(s.now), source: wb.Policy, reason: why})
		}
	}
	return cs
}

// 2c. Budgets in content-bytes and in concurrent-requests (units.go).
// The budgets in bytes join windows, for the upstream's policies of the
// same name to be filled from.
func (s snapshot) unitRule(d *decision, windows []windowed) ([]windowed, []constraint, error) {
	var cs []constraint
	bytes, err := s.byteBudgets()
	if err != nil {
		return windows, nil, err
	}
	for _, bb := range bytes {
		d.budgets = append(d.budgets, bb.Budget)
		windows = append(windows, bb.windowed)
		if bb.never || bb.avail < s.need(bb.Unit) {
			cs = append(cs, s.byteConstraint(bb))
		}
	}
	conc, waits := s.concurrencyBudgets()
	d.budgets = append(d.budgets, conc...)
	return windows, append(cs, waits...), nil
}

// 3. Upstream observations, projected within their own policy, unit,
// partition and validity. An expired one that asks for a probe sets
// d.probe.
func (s snapshot) observedRule(d *decision, windows []windowed) ([]constraint, error) {
	var cs []constraint
	for _, k := range s.applicable() {
		b, c, probe, err := s.observed(k)
		if err != nil {
			return nil, err
		}
		d.budgets = append(d.budgets, fillFromLog(b, windows))
		if probe {
			d.probe = true
		}
		if c.wait > 0 {
			cs = append(cs, c)
		} else if !b.Expired && b.Remaining > 0 && b.Reset > 0 && spreads(b.Unit) && low(b.Remaining, b.Limit, s.key.LowWater) {
			cs = append(cs, s.spreadRule(d, k, b))
		}
	}
	return cs, nil
}

// spreadRule spreads what an upstream policy has left, below its
// low-water mark, over what is left of the effective window, less what t
// may have been rounded up by: the window may end that much earlier, and
// what is left is there to spend now (a little early is still smooth; a
// little late is lost). The r calls go one share of r+1 apart, so the
// last goes a share before the end, not at it. (A share in percent of a
// quota nobody stated says nothing of how many calls are left: it is not
// spread.)
func (s snapshot) spreadRule(d *decision, k ledger.SeenPolicy, b Budget) constraint {
	d.slow = true
	spacing := max(b.Reset-rounding(k.Reset), 0) / time.Duration(b.Remaining+1)
	// The advice says the pace calls will go at: never above the key's
	// maximum rate, however much an upstream says is left.
	why := reason.Reason{Kind: reason.UpstreamLow, Policy: b.Policy, Unit: b.Unit, Left: b.Remaining, For: b.Reset, Spacing: max(spacing, minSpacing(s.key))}
	d.spreadBy(why)
	return constraint{wait: s.ks.LastAdmitAt.Add(spacing).Sub(s.now), source: b.Policy, reason: why}
}

// 4. A half-open circuit, or an observation that expired unanswered:
// exactly one probe goes, and the rest wait for its answer.
func (s snapshot) probeRule(d *decision) []constraint {
	if s.ks.HalfOpen {
		d.probe = true
	}
	if d.probe && s.ks.ProbeUntil.After(s.now) {
		return []constraint{{wait: Poll, poll: true, source: string(ProbeLimit), limit: ProbeLimit,
			reason: reason.Reason{Kind: reason.ProbeAsking}}}
	}
	return nil
}

// 5. Local safety limits: concurrency, the maximum rate, slow start.
// (A policy in concurrent-requests holds calls back as a budget: see
// concurrency.)
func (s snapshot) safetyRule() []constraint {
	var cs []constraint
	if s.flight.Count >= maxConcurrency(s.key) && !s.noFlightWait {
		cs = append(cs, constraint{wait: Poll, poll: true, source: string(ConcurrencyLimit), limit: ConcurrencyLimit,
			reason: reason.Reason{Kind: reason.InFlight, InFlight: int64(s.flight.Count)}})
	}
	spacing := max(minSpacing(s.key), s.ks.Interval)
	if !s.ks.LastAdmitAt.IsZero() {
		cs = append(cs, constraint{wait: s.ks.LastAdmitAt.Add(spacing).Sub(s.now), source: string(PaceLimit), limit: PaceLimit,
			reason: reason.Reason{Kind: reason.Spaced, Spacing: spacing}})
	}
	return cs
}

// spreads reports whether what is left in unit u is spread over calls
// below the low-water mark: not a share in percent of a quota nobody
// stated, and not bytes (a call carries as many as its body does).
func spreads(u ratelimit.Unit) bool {
	return u != ratelimit.Percent && u != ratelimit.ContentBytes && u != ratelimit.ConcurrentRequests
}

// spreadBy notes that calls are spread why.Spacing apart, as advice
// says: the widest spread is the one a caller meets.
func (d *decision) spreadBy(why reason.Reason) {
	if d.spread.IsZero() || why.Spacing > d.spacing {
		d.spread, d.spacing = why, why.Spacing
	}
}

// gateReason is why a closed gate holds calls back: what it says.
func gateReason(g ledger.Gate) reason.Reason {
	why := g.Reason
	if why.Kind == reason.Said {
		why.Source = string(g.Source) // kept as words only: what closed it says more
	}
	return why
}

// maxConcurrency is k's limit on calls in flight; zero means the default.
func maxConcurrency(k *keystore.Key) int {
	if k.MaxConcurrency > 0 {
		return k.MaxConcurrency
	}
	return keystore.DefaultMaxConcurrency
}

// minSpacing is the least time between two admissions of k: one over its
// maximum rate (zero means the default).
func minSpacing(k *keystore.Key) time.Duration {
	rate := k.MaxRate
	if rate <= 0 {
		rate = keystore.DefaultMaxRate
	}
	return time.Duration(float64(time.Second) / rate)
}

// windowed is a budget counted over the sliding-window log.
type windowed struct {
	Budget
	avail  int64     // calls this caller may still make now
	freeAt time.Time // when one more call becomes possible, if avail <= 0
	held   int64     // of the quota, kept for other callers' reservations
}

// A policyWindow is a policy of requests with a known quota and window,
// which the log can count: a documented one, or one the upstream
// announced with q and w (or that was inferred from a refusal).
type policyWindow struct {
	name, partition string
	q               int64
	w               time.Duration
	source          string
	hidden          bool
}

// policyWindows returns k's documented policies of requests and those of
// known that announced q and w in requests.
func policyWindows(k *keystore.Key, known []ledger.SeenPolicy) []policyWindow {
	var ps []policyWindow
	for _, p := range k.Policies {
		if requests(p.Unit) {
			ps = append(ps, policyWindow{p.Name, "", p.Quota, p.Window, "local", false})
		}
	}
	for _, kn := range known {
		// A leaky bucket paces as a rate (see leaky), not over the log.
		if kn.Unit == ratelimit.Requests && kn.HasQuota && kn.Window > 0 && kn.Shape != ratelimit.ShapeLeaky {
			ps = append(ps, policyWindow{kn.Policy, kn.Partition, kn.Quota, kn.Window, string(kn.Shape), kn.Hidden})
		}
	}
	return ps
}

// windowedBudgets returns the key's budgets with a known quota and window:
// its documented policies and every applicable upstream policy that
// announced q and w (or was inferred from a refusal), all counted over the
// local log.
func (s snapshot) windowedBudgets() ([]windowed, error) {
	ps := policyWindows(s.key, s.applicable())
	var out []windowed
	for _, p := range ps {
		// A send stays in the window a margin beyond w: the upstream
		// counts it from when it received it (see margin).
		m := s.margin(p.w)
		since := s.now.Add(-p.w - m)
		win, err := s.log.Window(since)
		if err != nil {
			return nil, err
		}
		n := int64(win.Count)
		if s.replaced(since) {
			n-- // the attempt this call replaces was never sent
		}
		held := s.held(p.q, win)
		limit := p.q - held
		wb := windowed{Budget: Budget{Policy: p.name, Unit: ratelimit.Requests, Partition: p.partition, Limit: p.q,
			Used: n, Window: p.w, Source: p.source, Hidden: p.hidden}}
		wb.held = held
		wb.avail = limit - n
		wb.Remaining = max(wb.avail, 0)
		if !win.Oldest.IsZero() {
			// The margin is the log's own caution: what a caller is told
			// never outlasts the window.
			wb.Reset = min(win.Oldest.Add(p.w+m).Sub(s.now), p.w)
		}
		if wb.avail <= 0 {
			// The call needs this many of the window's sends to leave it.
			e, err := s.log.Nth(since, int(n-limit+1))
			if err != nil {
				return nil, err
			}
			if e.IsZero() { // reservations alone exhaust it: wait a window
				e = s.now
			}
			wb.freeAt = e.Add(p.w + m)
		}
		out = append(out, wb)
	}
	return out, nil
}

// held returns how many units of a quota q are held back from this caller
// for other callers' reservations in a window holding win. An idle
// reservation (its caller made no call in the window and is not waiting)
// is lent.
func (s snapshot) held(q int64, win ledger.Window) int64 {
	var held int64
	for _, r := range s.key.Reserves {
		if r.Caller == s.caller {
			continue
		}
		used := int64(win.ByCaller[r.Caller])
		if used == 0 && !s.claimed[r.Caller] {
			continue
		}
		share := int64(math.Floor(r.Share * float64(q)))
		held += max(share-used, 0)
	}
	return held
}

// applicable returns the known policies that constrain this request. A
// policy seen in several partitions constrains through the partition its
// route was last seen in; when the route was never seen, every partition
// constrains (the safe guess). A per-route policy (its partition is a
// route, see routePartition) constrains that route alone, and so does a
// partition of a profile whose partitions are buckets of the routes that
// reported them (Discord): a route never seen meets none of them.
func (s snapshot) applicable() []ledger.SeenPolicy {
	byPolicy := map[string][]ledger.SeenPolicy{}
	var order []string
	own := routePartition(s.route)
	byRoute := s.key.Profile.PartitionsByRoute()
	for _, k := range s.seen {
		if strings.HasPrefix(k.Partition, routePartition("")) && k.Partition != own {
			continue
		}
		if byRoute && k.Partition != "" && k.Route != s.route {
			continue
		}
		id := k.Policy + "\x00" + string(k.Unit)
		if _, ok := byPolicy[id]; !ok {
			order = append(order, id)
		}
		byPolicy[id] = append(byPolicy[id], k)
	}
	var out []ledger.SeenPolicy
	for _, id := range order {
		group := byPolicy[id]
		var match []ledger.SeenPolicy
		for _, k := range group {
			if k.Partition == "" || k.Route == s.route {
				match = append(match, k)
			}
		}
		if len(match) == 0 || len(match) == len(group) {
			out = append(out, group...)
		} else {
			out = append(out, match...)
		}
	}
	return out
}

// observed projects one upstream observation to now: what is left of its r
// after every send since (by every caller and process), and whether its
// effective window has passed. An expired observation that nothing has
// answered since asks for one jittered probe; it never refills.
func (s snapshot) observed(k ledger.SeenPolicy) (b Budget, c constraint, probe bool, err error) {
	b = Budget{Policy: k.Policy, Unit: k.Unit, Partition: k.Partition, Limit: k.Quota, Remaining: -1,
		Window: k.Window, Source: string(k.Shape), Observed: k.ReceivedAt, Hidden: k.Hidden}
	if k.Unit == ratelimit.ConcurrentRequests {
		b, c = s.concurrency(k) // given back when calls end: it never expires
		return b, c, false, nil
	}
	if !k.HasRemaining {
		return b, c, false, nil // a policy listed but never shown: only its q and w constrain
	}
	end := k.ReceivedAt.Add(validity(k))
	if !s.now.Before(end) {
		b.Expired = true
		c, probe = s.expiredRule(k, end)
		return b, c, probe, nil
	}
	b.Reset = end.Sub(s.now)
	if isLeaky(k) {
		b, c, err = s.leaky(k, b, end)
		return b, c, false, err
	}
	remaining := k.Remaining
	switch k.Unit {
	case ratelimit.Requests:
		n, err := s.log.Count(k.BasisAt)
		if err != nil {
			return b, c, false, err
		}
		remaining -= int64(n)
	case ratelimit.ContentBytes:
		n, err := s.log.Bytes(k.BasisAt)
		if err != nil {
			return b, c, false, err
		}
		remaining -= n
	}
	b.Remaining = max(remaining, 0)
	if remaining < s.need(k.Unit) {
		c = constraint{wait: b.Reset, source: k.Policy, exhaust: true, keyWide: remaining <= 0,
			reason: reason.Reason{Kind: reason.UpstreamSpent, Policy: k.Policy, Unit: k.Unit, For: b.Reset}}
		if k.HasQuota {
			c.reason.Limit = k.Quota
		}
		if remaining > 0 {
			c.reason = reason.Reason{Kind: reason.UpstreamShort, Policy: k.Policy, Unit: k.Unit, Left: remaining,
				For: b.Reset, Carries: s.bytes}
		}
	}
	return b, c, false, nil
}

// expiredRule decides what follows an observation k whose effective
// window ended at end: nothing when an answer came since (a fresh observation
// came, or the policy was not shown); else, expired and unanswered since,
// one jittered probe (probe, once its jitter has passed), then a fresh
// answer.
func (s snapshot) expiredRule(k ledger.SeenPolicy, end time.Time) (c constraint, probe bool) {
	if s.ks.LastResponseAt.After(end) {
		return c, false
	}
	at := end.Add(jitter(s.key.Name+"\x00"+k.Policy+"\x00"+k.Partition, end, probeJitter(k)))
	if s.now.Before(at) {
		c = constraint{wait: at.Sub(s.now), source: k.Policy, exhaust: k.Remaining <= 0, keyWide: k.Remaining <= 0,
			reason: reason.Reason{Kind: reason.ProbeDue, Policy: k.Policy, For: at.Sub(s.now)}}
		return c, false
	}
	return c, true
}

// fillFromLog completes an upstream budget whose r is unknown or expired
// with what the local log knows of the same policy.
func fillFromLog(b Budget, windows []windowed) Budget {
	if b.Remaining >= 0 && !b.Expired {
		return b
	}
	for _, wb := range windows {
		if wb.Source != "local" && wb.Policy == b.Policy && wb.Partition == b.Partition && wb.Unit == b.Unit {
			b.Remaining, b.Used, b.Reset, b.Counted = wb.Remaining, wb.Used, wb.Reset, true
			if b.Reset == 0 {
				b.Reset = wb.Window
			}
			return b
		}
	}
	return b
}

// probeJitter bounds the jitter of the probe after k expires: ProbeJitter,
// or less in a short window (a share of it, so that the probe costs the
// same share of any window).
func probeJitter(k ledger.SeenPolicy) time.Duration {
	if isLeaky(k) {
		return time.Microsecond // a bucket leaks whether or not clients probe together
	}
	w := k.Window
	if w <= 0 {
		w = validity(k)
	}
	return max(min(ProbeJitter, w/probeJitterShare), time.Microsecond)
}

// rounding is how much sooner than an effective window t of d its window
// may end: t is sent in whole seconds and rounded up, so a whole number
// of seconds may be up to a second long (a t that is not, was not read
// rounded: it was measured, or tightened by other evidence).
func rounding(d time.Duration) time.Duration {
	if d > 0 && d%time.Second == 0 {
		return time.Second
	}
	return 0
}

// validity is how long an observation holds: its effective window t, else
// the policy window w, else DefaultValidity. A leaky bucket's holds while
// a full bucket would take to drain, w.
func validity(k ledger.SeenPolicy) time.Duration {
	switch {
	case isLeaky(k):
		return k.Window
	case k.HasReset && k.HasRemaining && k.Remaining <= 0 && k.Reset <= 0 && k.Unit != ratelimit.ConcurrentRequests:
		// Nothing left in a window said to end now (t=0, a reset already
		// past, a zero wait, in whatever field): no guidance, so no reason
		// to send at once. It lasts RetryFloor, as a zero Retry-After does.
		return RetryFloor
	case k.HasReset:
		return k.Reset
	case k.Window > 0:
		return k.Window
	}
	return DefaultValidity
}

// tightest returns the budget closest to exhaustion: the fewest remaining
// relative to its limit, the longest reset on ties.
func tightest(bs []Budget) *Budget {
	var best *Budget
	score := func(b Budget) float64 {
		if b.Remaining < 0 {
			return math.Inf(1)
		}
		if b.Limit > 0 {
			return float64(b.Remaining) / float64(b.Limit)
		}
		return float64(b.Remaining)
	}
	for i := range bs {
		b := &bs[i]
		if best == nil || score(*b) < score(*best) || (score(*b) == score(*best) && b.Reset > best.Reset) {
			best = b
		}
	}
	if best == nil {
		return nil
	}
	c := *best
	return &c
}

// low reports whether avail is at or below the low-water share of q.
func low(avail, q int64, share float64) bool {
	return q > 0 && float64(avail) <= share*float64(q)
}

// jitter returns a delay in [0, max) fixed by what and at: every process
// computes the same one, so they agree on when the probe goes, while
// different keys and moments spread out.
func jitter(what string, at time.Time, max time.Duration) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(what))
	fmt.Fprint(h, at.UnixMicro())
	// Whole microseconds, the state file's resolution.
	return time.Duration(h.Sum64() % uint64(max)).Truncate(time.Microsecond)
}
