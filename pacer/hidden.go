package pacer

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Hidden-limit inference settings.
const (
	// DefaultHiddenWindow is the least window inferred for a limit whose
	// refusal did not say when to come back: most limits count per minute
	// or longer, and a window guessed too short costs a second refusal.
	DefaultHiddenWindow = time.Minute
	// MaxHiddenWindow bounds the window of an inferred limit, and how far
	// back the log is read to infer it.
	MaxHiddenWindow = 24 * time.Hour
	// maxInferSends bounds the sends an inference replays.
	maxInferSends = 4096
	// sameLimit is how far apart (as a ratio) two inferred windows may be
	// and still be taken for the same limit, the later one correcting the
	// earlier. Limits of one API differ by more (a minute, an hour, a day).
	sameLimit = 2
)

// A limit is a quota inferred from a refusal: at most quota sends per
// window, the window starting with the send at start.
type limit struct {
	quota  int64
	window time.Duration
	start  time.Time
}

// inferLimit returns the limit a refusal reveals, a pure function of the
// times of the sends the upstream accepted before it (sends, oldest
// first), when the refusal came (at), and its Retry-After (ra, when hasRA).
//
// The refusing limit's window began with one of the sends, s[i]: then it
// holds the len(sends)-i sends from s[i] on, and it ends (it admits again)
// when s[i] leaves it, at+ra, so it is at+ra-s[i] long. Each i is a
// hypothesis. The one chosen is the most recent that the accepted sends
// do not contradict: a sliding window of that quota and length would have
// admitted every one of them (checked a second shorter, as Retry-After is
// rounded up to whole seconds). The first send always fits: every send is
// then in the window, as when the key was fresh, or when the upstream
// counts fixed windows that began with it.
//
// Without a Retry-After the window's end is unknown: windows are taken to
// be at least DefaultHiddenWindow.
func inferLimit(sends []time.Time, at time.Time, ra time.Duration, hasRA bool) (limit, bool) {
	n := len(sends)
	if n == 0 {
		return limit{}, false
	}
	end := at
	tolerance := time.Duration(0)
	if hasRA {
		end, tolerance = at.Add(ra), time.Second
	}
	hyp := func(i int) limit {
		h := limit{quota: int64(n - i), window: end.Sub(sends[i]), start: sends[i]}
		if !hasRA {
			h.window = max(h.window, DefaultHiddenWindow)
		}
		h.window = min(h.window, MaxHiddenWindow)
		return h
	}
	for i := n - 1; i > 0; i-- {
		h := hyp(i)
		if w := h.window - tolerance; w > 0 && maxBefore(sends, w) < h.quota {
			return h, true
		}
	}
	return hyp(0), true
}

// maxBefore returns the most sends that preceded any one send within w:
// the most a sliding window of length w held when a send was admitted.
func maxBefore(sends []time.Time, w time.Duration) int64 {
	var most int64
	lo := 0
	for j, t := range sends {
		for !sends[lo].After(t.Add(-w)) {
			lo++
		}
		most = max(most, int64(j-lo))
	}
	return most
}

// hiddenLimit plans to record the limit a refusal revealed when nothing
// the pacer knew explains it, with the warning to show (none when the
// refusal was explained); it reads the policies seen (the answer's own
// put), the log and the warnings in v. The limit is named by the problem's
// violated-policies when it names a policy nobody announced, else
// "hidden" (or "hidden-2"…, for a second limit of a different window).
//
// A refusal of a call admitted before a hidden limit was recorded is part
// of that discovery. A later one, with calls accepted since the latest
// discovery, is inferred from those calls: it corrects the limit of about
// the same window, or reveals another. A later one with no call accepted
// since means the latest limit's window is longer than it seemed: it is
// stretched to reach past the refusal (by Retry-After, or, without one,
// to at least twice its length).
func (a *answer) hiddenLimit(v outcomeView, inFlightTimeout time.Duration) (outcomePlan, error) {
	t, rd, now := a.t, a.rd, a.now
	c := t.Call
	key := c.Key.Name
	var part outcomePlan
	known, err := v.SeenPolicies(key)
	if err != nil {
		return part, err
	}
	hidden, latest, during := hiddenSoFar(known, t.AdmittedAt)
	if during {
		return part, nil // discovered while this call was in flight
	}
	name, explained := unannouncedName(rd, known, c.Key.Policies)
	if explained {
		return part, nil // it names limits we know: our count of them was behind
	}
	if name == "" {
		// A call admitted as a known policy's window freed a slot can
		// reach the upstream a moment before its own window frees it:
		// that policy's timing explains the refusal, which reveals no
		// new limit. Its Retry-After (or backoff) gate is all it sets.
		edge, err := windowEdge(v, t, rd, now, known, inFlightTimeout)
		if err != nil || !edge.IsZero() {
			return raise(part, key, now, ledger.WindowEdgeWarning, edge), err
		}
	}
	sends, err := acceptedSends(v, t, latest, now)
	if err != nil {
		return part, err
	}
	inf := inferHidden(name, hidden, latest, sends, rd, now)
	if inf.renew {
		// No quota to stretch: the latest discovery is renewed as it is.
		part.seen = []seenChange{putSeen(ledger.SeenPolicy{Key: key, ReceivedAt: now, BasisAt: latest.BasisAt, Hidden: true,
			Route: latest.Route, Observation: latest.Observation})}
		return part, nil
	}
	// For a hidden limit (which has no r) BasisAt keeps the start of the
	// window that revealed it.
	part.seen = []seenChange{putSeen(ledger.SeenPolicy{Key: key, ReceivedAt: now, BasisAt: inf.lim.start, Hidden: true, Route: c.route(),
		Observation: ratelimit.Observation{Policy: inf.name, Unit: ratelimit.Requests, Quota: inf.lim.quota, HasQuota: inf.lim.quota > 0,
			Window: inf.lim.window, Shape: ratelimit.ShapeInferred}})}
	return raise(part, key, now, ledger.HiddenLimitWarning, inf.warning(key)), nil
}

// raise adds to part the warning why of kind about key at now: recorded,
// and told to the caller.
func raise(part outcomePlan, key string, now time.Time, kind ledger.WarningKind, why reason.Reason) outcomePlan {
	if why.IsZero() {
		return part
	}
	part.warnings = append(part.warnings, ledger.Warning{Key: key, At: now, Kind: kind, Reason: why})
	part.res.Warnings = append(part.res.Warnings, why)
	return part
}

// hiddenSoFar returns the hidden limits among known and the latest
// discovered of them, or during when one was discovered while a call
// admitted at admitted was in flight (its refusal is part of that
// discovery).
func hiddenSoFar(known []ledger.SeenPolicy, admitted time.Time) (hidden []ledger.SeenPolicy, latest *ledger.SeenPolicy, during bool) {
	for i, k := range known {
		if k.Hidden {
			if !k.ReceivedAt.Before(admitted) {
				return nil, nil, true
			}
			hidden = append(hidden, k)
			if latest == nil || k.ReceivedAt.After(latest.ReceivedAt) {
				latest = &known[i]
			}
		}
	}
	return hidden, latest, false
}

// unannouncedName returns the first policy the refusal's problem names as
// violated that neither the upstream (known, not hidden) nor the key's
// configuration (policies) announced, or "" when it names none.
// explained says it names policies, and none of them is new (an empty
// name counts as none).
func unannouncedName(rd *ratelimit.Reading, known []ledger.SeenPolicy, policies []keystore.Policy) (name string, explained bool) {
	if rd.Problem == nil || len(rd.Problem.ViolatedPolicies) == 0 {
		return "", false
	}
	announced := func(v string) bool {
		return slices.ContainsFunc(known, func(k ledger.SeenPolicy) bool { return k.Policy == v && !k.Hidden }) ||
			slices.ContainsFunc(policies, func(pol keystore.Policy) bool { return pol.Name == v })
	}
	for _, v := range rd.Problem.ViolatedPolicies {
		if v = boundName(v); !announced(v) {
			name = v
			break
		}
	}
	return name, name == ""
}

// acceptedSends returns the times of the sends the upstream accepted
// before t was admitted, oldest first. Sends before the latest discovery
// belong to windows its Retry-After waited out: a later refusal is
// inferred from the sends since.
func acceptedSends(v outcomeView, t Ticket, latest *ledger.SeenPolicy, now time.Time) ([]time.Time, error) {
	since := now.Add(-MaxHiddenWindow)
	if latest != nil {
		since = maxTime(since, latest.ReceivedAt)
	}
	log, err := v.Sends(t.Call.Key.Name, since, maxInferSends)
	if err != nil {
		return nil, err
	}
	var sends []time.Time
	for _, s := range log {
		if s.ID != t.ID && s.At.Before(t.AdmittedAt) && s.Status != http.StatusTooManyRequests {
			sends = append(sends, s.At)
		}
	}
	return sends, nil
}

// A hiddenInference is what a refusal nothing explained teaches: the
// limit to record under name, and how it was found.
type hiddenInference struct {
	name string
	lim  limit
	// inferred: the limit was inferred from the accepted sends.
	inferred bool
	// stretched: the latest limit was refused again before anything got
	// through, and its window was stretched.
	stretched bool
	// renew: as stretched, but the latest limit has no quota to stretch:
	// it is only renewed.
	renew bool
}

// inferHidden decides the limit a refusal at now reveals, a pure function
// of the name the refusal gave ("" for none), the hidden limits known so
// far (latest the most recent, or nil), and the accepted sends since it.
// With sends, the limit is inferred from them; without, the latest limit
// refused again reaches further back than it seemed; with neither, the
// limit waits out the refusal's Retry-After (at least
// DefaultHiddenWindow) with no quota known.
func inferHidden(name string, hidden []ledger.SeenPolicy, latest *ledger.SeenPolicy, sends []time.Time, rd *ratelimit.Reading, now time.Time) hiddenInference {
	lim, ok := inferLimit(sends, now, rd.RetryAfter, rd.HasRetryAfter)
	switch {
	case ok:
		if name == "" {
			name = hiddenName(hidden, lim.window)
		}
		return hiddenInference{name: name, lim: lim, inferred: true}
	case latest != nil && (name == "" || name == latest.Policy):
		// Refused again before anything got through: the latest limit
		// reaches further back than it seemed.
		if !latest.HasQuota {
			return hiddenInference{name: latest.Policy, renew: true}
		}
		lim = limit{quota: latest.Quota, window: max(2*latest.Window, now.Sub(latest.BasisAt)), start: latest.BasisAt}
		if rd.HasRetryAfter {
			lim.window = max(latest.Window, now.Add(rd.RetryAfter).Sub(latest.BasisAt))
		}
		lim.window = min(lim.window, MaxHiddenWindow)
		return hiddenInference{name: latest.Policy, lim: lim, stretched: true}
	}
	lim = limit{window: max(DefaultHiddenWindow, rd.RetryAfter), start: now}
	if name == "" {
		name = hiddenName(hidden, lim.window)
	}
	return hiddenInference{name: name, lim: lim}
}

// warning is the warning about key that an inference raises.
func (inf hiddenInference) warning(key string) reason.Reason {
	why := reason.Reason{Kind: reason.HiddenUnaccepted, Key: key, Policy: inf.name, Limit: inf.lim.quota, Window: inf.lim.window}
	switch {
	case inf.stretched:
		why.Kind = reason.HiddenStretched
	case inf.inferred:
		why.Kind = reason.HiddenLimit
	}
	return why
}

// hiddenName names a newly inferred limit of window w: the hidden limit
// of about the same window it corrects, else the first free name.
func hiddenName(hidden []ledger.SeenPolicy, w time.Duration) string {
	for _, k := range hidden {
		if k.Window > 0 && float64(max(w, k.Window)) <= sameLimit*float64(min(w, k.Window)) {
			return k.Policy
		}
	}
	name := "hidden"
	for i := 2; slices.ContainsFunc(hidden, func(k ledger.SeenPolicy) bool { return k.Policy == name }); i++ {
		name = fmt.Sprintf("hidden-%d", i)
	}
	return name
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// windowEdge returns the warning for a refusal of t that a known policy's
// window explains, or the zero Reason when none does: the key's documented policies
// and those the upstream announced with q and w. A policy explains it
// when its whole quota of other sends (by every caller, not refused) can
// still have been in its window when t reached the upstream: each was
// admitted before t and answered (or is still unanswered) less than w
// before t was admitted, as an upstream counts a send at the latest when
// it answers it. Then t took a slot the log had freed (a send took longer
// to reach the upstream than the log's margin allowed for) and the
// upstream had not. The refusal's Retry-After, if any, must also ask to
// wait no longer than until the oldest of them leaves that window (and
// the rounding of Retry-After up to the second). A second such refusal
// within two of the policy's windows is no race at a window's edge: then
// nothing explains it.
func windowEdge(v outcomeView, t Ticket, rd *ratelimit.Reading, now time.Time, known []ledger.SeenPolicy, inFlightTimeout time.Duration) (reason.Reason, error) {
	c := t.Call
	for _, p := range policyWindows(c.Key, known) {
		if p.hidden || p.q <= 0 {
			continue // an inferred limit's timing explains nothing; q = 0 has no slot to take
		}
		warned, err := v.Warned(c.Key.Name, ledger.WindowEdgeWarning, now.Add(-2*p.w))
		if err != nil {
			return reason.Reason{}, err
		}
		if warned {
			continue
		}
		// A send admitted a lease before the window is answered or given up.
		sends, err := v.Sends(c.Key.Name, t.AdmittedAt.Add(-p.w-inFlightTimeout), maxInferSends)
		if err != nil {
			return reason.Reason{}, err
		}
		if len(sends) == maxInferSends {
			continue // too many to tell
		}
		// The latest time each send can have been counted at.
		var counted []time.Time
		for _, s := range sends {
			if s.ID == t.ID || !s.At.Before(t.AdmittedAt) || s.Status == http.StatusTooManyRequests || s.State == ledger.RejectedUpstream {
				continue
			}
			at := s.AnsweredAt
			if at.IsZero() {
				at = t.AdmittedAt // unanswered then
			}
			if at.After(t.AdmittedAt.Add(-p.w)) {
				counted = append(counted, at)
			}
		}
		if int64(len(counted)) < p.q {
			continue
		}
		slices.SortFunc(counted, time.Time.Compare)
		oldest := counted[len(counted)-int(p.q)] // the send whose slot t took
		if rd.HasRetryAfter && now.Add(rd.RetryAfter).After(oldest.Add(p.w+time.Second)) {
			continue
		}
		return reason.Reason{Kind: reason.WindowEdge, Key: c.Key.Name, Policy: p.name, Limit: p.q, Window: p.w}, nil
	}
	return reason.Reason{}, nil
}
