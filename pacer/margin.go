package pacer

import (
	"math"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// The log records a send when it is admitted, but the upstream counts it
// from when it receives it, a moment later. A call admitted the instant a
// send leaves the log's window could therefore reach the upstream before
// that send has left the upstream's window, and be refused. So a send
// stays in the log's window of w for w plus a margin: the longest time
// from admission to answer recently seen on the key (an answer comes
// after its request was received), or, while a call is still in flight,
// as long as it has been. The margin is bounded, so that a slow endpoint
// (whose answers take long after they were received) cannot stall a key.
const (
	// MaxMargin bounds the margin in any window.
	MaxMargin = time.Second
	// marginShare bounds the margin in a window of w to w/marginShare.
	marginShare = 20
)

// marginCap is the most a send stays in a window of w beyond w.
func marginCap(w time.Duration) time.Duration {
	return min(MaxMargin, w/marginShare)
}

// margin is how long beyond w a send stays in a window of w, as of s: the
// key's recent admission-to-answer latency, or the age of its oldest call
// in flight when that is longer, within marginCap(w); or, when longer
// still, the longest delay from admission to send of this process's
// recent sends plus that latency margin again, within sendMarginCap(w).
// A send that left late still has its way to the upstream ahead of it,
// and its answer's latency bounds that way: without it, a send that left
// just within its allowance would land after the log let its slot go.
func (s snapshot) margin(w time.Duration) time.Duration {
	lm := latencyMargin(s.ks, w)
	m := lm
	if s.delay.longest > 0 {
		m = max(m, min(s.delay.longest+lm, sendMarginCap(w)))
	}
	if !s.flight.Oldest.IsZero() {
		m = max(m, min(s.now.Sub(s.flight.Oldest), marginCap(w)))
	}
	return m
}

// latencyMargin is how long beyond w a send stays in a window of w for
// the latencies ks has seen: the longest recent one, within marginCap(w).
func latencyMargin(ks ledger.KeyState, w time.Duration) time.Duration {
	return min(max(ks.Latency, ks.PrevLatency), marginCap(w))
}

// noteLatency records in ks that a call answered at now took lat from its
// admission. The longest latency is kept for the current period and the
// one before, so that it covers at least the last period: every send that
// can still be in a window is answered within it when period is the
// longest window plus its margin.
func noteLatency(ks *ledger.KeyState, lat time.Duration, now time.Time, period time.Duration) {
	lat = min(max(lat, 0), MaxMargin)
	switch d := now.Sub(ks.LatencySince); {
	case ks.LatencySince.IsZero() || d >= 2*period:
		ks.PrevLatency, ks.Latency, ks.LatencySince = 0, lat, now
	case d >= period:
		ks.PrevLatency, ks.Latency, ks.LatencySince = ks.Latency, lat, now
	default:
		ks.Latency = max(ks.Latency, lat)
	}
}

// latencyPeriod is how long a latency must be remembered for the windows
// of k and of the policies known for it: the longest of them, with its
// margin.
func latencyPeriod(k *keystore.Key, known []ledger.SeenPolicy) time.Duration {
	var w time.Duration
	for _, p := range k.Policies {
		w = max(w, p.Window)
	}
	for _, kn := range known {
		if kn.Unit == ratelimit.Requests {
			w = max(w, kn.Window)
		}
	}
	return w + marginCap(w)
}

// A send leaves its process a moment after its admission: the admission's
// transaction commits, the request is built and handed to the network.
// On a busy machine that moment grows, and a send that leaves later than
// the margin allows reaches the upstream's window after the log has let
// its slot go. So each process measures how long its sends of a key take
// to leave (sendDelays). A send may leave as late as marginCap(w), or the
// delayPercentile-th percentile of the recent delays when that is longer
// (its allowance, within sendMarginCap); a send that would leave later is
// not sent: its attempt
// ends, counted where it was admitted, and the call is admitted again, in
// the window it will land in (see Pacer.Leaving). The process's decisions
// then keep a send in the window beyond w for the longest delay of the
// sends that went, when that is longer than the margin above — within
// sendMarginCap(w), for a period of the key's longest window with its
// margin, as the latency is kept (see noteLatency).
const (
	// MaxSendMargin bounds the margin that measured send delays give any
	// window.
	MaxSendMargin = 5 * time.Second
	// sendMarginShare bounds that margin in a window of w to
	// w/sendMarginShare.
	sendMarginShare = 8
	// delaySamples is how many of a key's latest send delays a process
	// keeps for their percentile.
	delaySamples = 64
	// delayPercentile is the share of the recent send delays a send's
	// allowance covers.
	delayPercentile = 0.95
	// delayMemory is how long a send delay counts towards the percentile.
	delayMemory = time.Minute
)

// sendMarginCap is the most a measured send delay keeps a send in a
// window of w beyond w: never less than marginCap(w).
func sendMarginCap(w time.Duration) time.Duration {
	return max(marginCap(w), min(MaxSendMargin, w/sendMarginShare))
}

// sendDelays are one key's delays from admission to send in this
// process: the latest delaySamples of every send that was about to leave,
// each with when it was measured, for their percentile; and the longest
// of those that went, in the current period and the one before. The zero
// value holds none. It is not safe for concurrent use.
type sendDelays struct {
	at   [delaySamples]time.Time
	d    [delaySamples]time.Duration
	n    int // how many are held
	next int // where the next goes

	longest, prevLongest time.Duration // of the sends that went, this period and the one before
	since                time.Time     // when this period began
	period               time.Duration // the latest period given
}

// A delayEstimate is what a process's decisions know of a key's send
// delays (see sendDelays); the zero value is none measured.
type delayEstimate struct {
	high    time.Duration // the delayPercentile-th percentile of the recent ones
	longest time.Duration // the longest of the sends that went, for at least a period
}

// note records that a send measured at now was about to leave d after
// its admission, and whether it went (was not late); period is how long
// the delay of one that went must be remembered at least.
func (s *sendDelays) note(now time.Time, d time.Duration, went bool, period time.Duration) {
	d = max(d, 0)
	s.at[s.next], s.d[s.next] = now, d
	s.next = (s.next + 1) % delaySamples
	s.n = min(s.n+1, delaySamples)
	if !went {
		return
	}
	s.period = period
	switch e := now.Sub(s.since); {
	case s.since.IsZero() || e >= 2*period:
		s.prevLongest, s.longest, s.since = 0, d, now
	case e >= period:
		s.prevLongest, s.longest, s.since = s.longest, d, now
	default:
		s.longest = max(s.longest, d)
	}
}

// estimate returns what s says as of now.
func (s *sendDelays) estimate(now time.Time) delayEstimate {
	var e delayEstimate
	if !s.since.IsZero() && now.Sub(s.since) < 2*s.period {
		e.longest = s.longest
		if now.Sub(s.since) < s.period {
			e.longest = max(e.longest, s.prevLongest)
		}
	}
	var recent [delaySamples]time.Duration
	k := 0
	for i := range s.n {
		if now.Sub(s.at[i]) < delayMemory {
			recent[k] = s.d[i]
			k++
		}
	}
	if k > 0 {
		ds := recent[:k]
		slices.Sort(ds)
		e.high = ds[int(math.Ceil(delayPercentile*float64(k)))-1]
	}
	return e
}

// sendDelay is what this process knows of key's send delays as of now.
func (p *Pacer) sendDelay(key string, now time.Time) delayEstimate {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.delays[key]; s != nil {
		return s.estimate(now)
	}
	return delayEstimate{}
}

// noteSendDelay records a send of key as sendDelays.note does.
func (p *Pacer) noteSendDelay(key string, now time.Time, d time.Duration, went bool, period time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.delays == nil {
		p.delays = map[string]*sendDelays{}
	}
	s := p.delays[key]
	if s == nil {
		s = &sendDelays{}
		p.delays[key] = s
	}
	s.note(now, d, went, period)
}

// A sendAllowance is how late after its admission a ticket's send may
// leave, and how long its delay must then be remembered. The zero value
// allows any time.
type sendAllowance struct {
	allowed time.Duration
	period  time.Duration
}

// allowance is how long after an admission at s.now its send may leave:
// for each windowed policy of the key, marginCap(w), or the recent send
// delays when longer (their percentile, or the longest that went), within
// sendMarginCap(w) less the latency margin that the send's way to the
// upstream keeps — the least of these over the policies. A send within
// it goes, and its delay joins the longest that the margin keeps. The
// zero value, when no window binds the send, allows any time.
func (s snapshot) allowance() sendAllowance {
	var a sendAllowance
	for i, p := range policyWindows(s.key, s.applicable()) {
		way := latencyMargin(s.ks, p.w) // kept for the send's way to the upstream (see margin)
		m := max(marginCap(p.w), min(max(s.delay.high, s.delay.longest), sendMarginCap(p.w)-way))
		if i == 0 || m < a.allowed {
			a.allowed = m
		}
	}
	if a.allowed > 0 {
		a.period = latencyPeriod(s.key, s.seen) + MaxSendMargin
	}
	return a
}

// A LateError is a send that would leave later after its admission than
// its allowance (see Pacer.Leaving): it is not sent, and its call is
// admitted again.
type LateError struct {
	Delay   time.Duration // from its admission to now
	Allowed time.Duration // the most its allowance was

	admitted time.Time // when the attempt not sent was admitted
}

func (e *LateError) Error() string { return e.reason().String() }

// reason is why e's request was not sent.
func (e *LateError) reason() reason.Reason {
	return reason.Reason{Kind: reason.Late, For: e.Delay, Allowed: e.Allowed}
}

// Leaving is told that t's request is about to leave, at once. It records
// how long after its admission it leaves, for the margin of the key's
// next decisions in this process; and it returns a *LateError when that
// is later than t's allowance. Then the request must not be sent: end t
// with Done and an Outcome whose Err is the *LateError (CallerAbort set),
// and admit the call again with the *LateError as its Call.Late: that
// admission does not count the attempt it replaces, which stays counted
// for every other one. A ticket from a lease is never late: its
// lease lasts a fraction of the margin (see lease.go).
func (p *Pacer) Leaving(t Ticket) error {
	if t.Leased() {
		return nil
	}
	now := p.now()
	d := now.Sub(t.AdmittedAt)
	a := t.send
	late := a.allowed > 0 && d > a.allowed
	p.noteSendDelay(t.Call.Key.Name, now, d, !late, a.period)
	if late {
		return &LateError{Delay: d, Allowed: a.allowed, admitted: t.AdmittedAt}
	}
	return nil
}

// replaced is whether an attempt admitted after since is the one s's call
// replaces (see Call.Late): its own admission does not count it, since it
// was never sent.
func (s snapshot) replaced(since time.Time) bool {
	return s.late != nil && s.late.admitted.After(since)
}
