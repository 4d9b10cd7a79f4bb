// Package report renders what mcp-quota knows about a key's quota in the
// one shape every surface shares: the fetch tool's quota and advice, the
// quota_status tool, REST's GET /v1/quota and `mcp-quota status --json`.
// Durations are whole seconds (rounded up), times RFC 3339 in UTC.
package report

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Quota is the budget that binds a key: its tightest policy.
type Quota struct {
	Key        string `json:"key" jsonschema:"the key the call went through"`
	Policy     string `json:"policy" jsonschema:"the policy closest to exhaustion; empty when none is known"`
	Unit       string `json:"unit,omitempty" jsonschema:"what limit and remaining count: requests, content-bytes (the bytes request bodies carry) or concurrent-requests (calls in flight at once); empty when no policy is known"`
	Limit      int64  `json:"limit" jsonschema:"the policy's quota per window (q); 0 when unknown"`
	Remaining  int64  `json:"remaining" jsonschema:"what is left now, in unit, after every caller sharing the key; -1 when unknown. A hint, not a grant"`
	ResetS     int64  `json:"reset_s" jsonschema:"seconds until the effective window ends (not a refill time)"`
	WindowS    int64  `json:"window_s" jsonschema:"the policy's window in seconds (w); 0 when unknown"`
	Source     string `json:"source" jsonschema:"local (a documented policy counted by mcp-quota) or the header shape the upstream used"`
	ObservedAt string `json:"observed_at,omitempty" jsonschema:"when the upstream said it (RFC 3339)"`
}

// Advice is what a caller should do next.
type Advice struct {
	Action      string `json:"action" jsonschema:"continue, slow_down or pause"`
	RetryAfterS int64  `json:"retry_after_s" jsonschema:"for pause: wait at least this many seconds before the next call"`
	Reason      string `json:"reason" jsonschema:"one plain sentence saying why"`
}

// NewQuota renders the tightest budget b of key (b may be nil).
func NewQuota(key string, b *pacer.Budget) Quota {
	q := Quota{Key: key, Remaining: -1, Source: "none"}
	if b == nil {
		return q
	}
	q.Policy, q.Unit, q.Limit, q.Remaining, q.Source = b.Policy, string(b.Unit), b.Limit, b.Remaining, b.Source
	q.ResetS, q.WindowS = Seconds(b.Reset), Seconds(b.Window)
	if !b.Observed.IsZero() {
		q.ObservedAt = b.Observed.UTC().Format(time.RFC3339)
	}
	return q
}

// NewAdvice renders a, its reason said as reason.Advice says it.
func NewAdvice(a pacer.Advice) Advice {
	return Advice{Action: string(a.Action), RetryAfterS: Seconds(a.RetryAfter), Reason: reason.Advice(string(a.Action), a.RetryAfter, a.Why)}
}

// Seconds rounds d up to whole seconds; never negative.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// Status is everything known about the keys a caller may use.
type Status struct {
	// Caller names who the answer is for: a configured caller, or the
	// principal of an OAuth token ("alice@example.com via Claude.ai").
	Caller string      `json:"caller,omitempty" jsonschema:"who this answer is for: the caller, or the person or job of an OAuth token and the client it came through"`
	Keys   []KeyStatus `json:"keys" jsonschema:"one entry per key shown, the most constrained first"`
	Advice Advice      `json:"advice" jsonschema:"the advice for the most constrained key"`
	// More summarises the keys a page leaves out; nil when every key is shown.
	More *More `json:"more,omitempty" jsonschema:"the keys not shown on this page, summarised"`
}

// More summarises the keys a page of a Status leaves out.
type More struct {
	Keys       int    `json:"keys" jsonschema:"how many keys are not shown"`
	Pause      int    `json:"pause" jsonschema:"of those, how many say pause"`
	SlowDown   int    `json:"slow_down" jsonschema:"of those, how many say slow_down"`
	Continue   int    `json:"continue" jsonschema:"of those, how many say continue"`
	NextOffset int    `json:"next_offset,omitempty" jsonschema:"the offset of the next page; 0 when this is the last"`
	Hint       string `json:"hint" jsonschema:"how to see the others"`
}

// Page orders st's keys the most constrained first (pause, then slow_down,
// then the smallest share left of the tightest budget) and keeps limit of
// them from offset; the rest are counted in More. A limit of 0 or less
// keeps every key from offset.
func (st Status) Page(offset, limit int) Status {
	keys := slices.Clone(st.Keys)
	slices.SortStableFunc(keys, moreConstrained)
	offset = min(max(offset, 0), len(keys))
	end := len(keys)
	if limit > 0 {
		end = min(offset+limit, len(keys))
	}
	out := Status{Caller: st.Caller, Keys: keys[offset:end], Advice: st.Advice}
	if offset == 0 && end == len(keys) {
		return out
	}
	m := &More{Keys: len(keys) - (end - offset)}
	for _, k := range slices.Concat(keys[:offset], keys[end:]) {
		switch pacer.Action(k.Advice.Action) {
		case pacer.Pause:
			m.Pause++
		case pacer.SlowDown:
			m.SlowDown++
		default:
			m.Continue++
		}
	}
	m.Hint = "Call quota_status with key=NAME for one key"
	if end < len(keys) {
		m.NextOffset = end
		m.Hint += fmt.Sprintf(", or offset=%d for the next %d", end, min(end-offset, len(keys)-end))
	}
	m.Hint += "."
	out.More = m
	return out
}

// moreConstrained orders key statuses the most constrained first: pause,
// then slow_down, then the smallest share left of the tightest budget,
// then by name. Every surface lists keys in this order (see Build), and
// the overall advice is the first key's.
func moreConstrained(a, b KeyStatus) int {
	return cmp.Or(cmp.Compare(severity(b.Advice.Action), severity(a.Advice.Action)),
		cmp.Compare(shareLeft(a.Quota), shareLeft(b.Quota)), cmp.Compare(a.Key, b.Key))
}

// shareLeft is the share of q's limit that is left: 0 for none, 1 (the
// last) when nothing is known.
func shareLeft(q Quota) float64 {
	if q.Limit <= 0 || q.Remaining < 0 {
		return 1
	}
	return float64(q.Remaining) / float64(q.Limit)
}

// KeyStatus is one key's budget, for planning.
type KeyStatus struct {
	Key              string        `json:"key"`
	Credential       string        `json:"credential" jsonschema:"ok, or why the key's credential is unavailable"`
	Local            []Local       `json:"local" jsonschema:"the documented policies, counted over every caller and process sharing the key"`
	Upstream         []Upstream    `json:"upstream" jsonschema:"the policies the upstream announced or a refusal revealed (at most 16: past that, the most constrained)"`
	UpstreamNotShown int           `json:"upstream_not_shown,omitempty" jsonschema:"how many less constrained upstream policies are not shown"`
	RetryAfter       *Gate         `json:"retry_after,omitempty" jsonschema:"the gate nothing passes before, when one is closed"`
	Reservations     []Reservation `json:"reservations,omitempty"`
	Warnings         []string      `json:"warnings,omitempty" jsonschema:"raised in the last hour: hidden limits, abnormal usage, an open circuit"`
	InFlight         int           `json:"in_flight"`
	Quota            Quota         `json:"quota" jsonschema:"the tightest budget"`
	Advice           Advice        `json:"advice"`
}

// MaxUpstream is the most upstream policies a KeyStatus shows: the most
// constrained, whatever the upstream announced. With names of at most
// pacer.MaxName bytes and at most 20 warnings, one key's status stays
// within a few tens of thousands of characters.
const MaxUpstream = 16

// budgetLeft is the share of b that is left, for ordering: an exhausted
// or expired budget first, one whose r is unknown last.
func budgetLeft(b pacer.Budget) float64 {
	switch {
	case b.Remaining < 0:
		return 2
	case b.Limit > 0:
		return float64(b.Remaining) / float64(b.Limit)
	case b.Remaining == 0:
		return 0
	}
	return 1
}

// Local is a documented policy's shared local budget.
type Local struct {
	Policy    string `json:"policy"`
	Unit      string `json:"unit" jsonschema:"requests, content-bytes or concurrent-requests"`
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used" jsonschema:"what every caller spent in the current window, in unit (concurrent-requests: the calls in flight)"`
	Remaining int64  `json:"remaining" jsonschema:"what this caller may still spend now, in unit"`
	ResetS    int64  `json:"reset_s" jsonschema:"seconds until the oldest call in the window leaves it"`
	WindowS   int64  `json:"window_s"`
	Binds     bool   `json:"binds" jsonschema:"this is the budget that binds now: the tightest, which quota and advice are about"`
}

// Upstream is one policy the upstream announced, with its latest value.
type Upstream struct {
	Policy     string `json:"policy"`
	Unit       string `json:"unit"`
	Partition  string `json:"partition,omitempty"`
	Q          int64  `json:"q" jsonschema:"quota per window; 0 when unknown"`
	W          int64  `json:"w" jsonschema:"window in seconds; 0 when unknown"`
	R          int64  `json:"r" jsonschema:"available now: the upstream's r minus every send since it was observed; when that r is unknown or expired, what mcp-quota's own count of q per w leaves (counted_locally); -1 when neither is known"`
	Counted    bool   `json:"counted_locally" jsonschema:"r and t come from mcp-quota's count of every caller's sends, not from a fresh upstream r"`
	T          int64  `json:"t" jsonschema:"seconds left of the effective window"`
	ObservedAt string `json:"observed_at"`
	AgeS       int64  `json:"age_s"`
	Expired    bool   `json:"expired" jsonschema:"past its effective window: r no longer holds, a probe asks again"`
	Hidden     bool   `json:"hidden" jsonschema:"never announced: inferred from a refusal and enforced locally"`
	Source     string `json:"source"`
	Binds      bool   `json:"binds" jsonschema:"this is the budget that binds now: the tightest, which quota and advice are about"`
}

// Gate is a time before which nothing is sent.
type Gate struct {
	Until       string `json:"until"`
	RetryAfterS int64  `json:"retry_after_s"`
	Source      string `json:"source" jsonschema:"retry-after, backoff, circuit or abnormal-usage"`
	Reason      string `json:"reason"`
}

// Reservation is a share of a key kept for one caller.
type Reservation struct {
	Caller string  `json:"caller"`
	Share  float64 `json:"share"`
}

// A statuser reports a key's budget: *pacer.Pacer.
type statuser interface {
	Status(ctx context.Context, k *keystore.Key, caller string) (pacer.KeyStatus, error)
}

// Build reports every key in keys as caller meets it, the most
// constrained first (moreConstrained), reading only the state file. A
// reservation of a principal that caller may not see is not named to it
// (as the dashboard's spenders are not); a nil caller (the command
// line's) sees everything.
func Build(ctx context.Context, p statuser, keys []*keystore.Key, caller *keystore.Caller, now time.Time) (Status, error) {
	name := ""
	if caller != nil {
		name = caller.Name
	}
	out := Status{Caller: name, Keys: []KeyStatus{}, Advice: Advice{Action: string(pacer.Continue), Reason: "No key is configured."}}
	for _, k := range keys {
		st, err := p.Status(ctx, k, name)
		if err != nil {
			return out, err
		}
		ks := newKeyStatus(k, st, now)
		if caller != nil && !caller.SeesEveryone() {
			ks.Reservations = slices.DeleteFunc(ks.Reservations, func(r Reservation) bool { return !caller.MaySee(r.Caller) })
		}
		out.Keys = append(out.Keys, ks)
	}
	slices.SortStableFunc(out.Keys, moreConstrained)
	if len(out.Keys) > 0 {
		worst := out.Keys[0]
		out.Advice = worst.Advice
		if len(out.Keys) > 1 {
			out.Advice.Reason = fmt.Sprintf("Key '%s': %s", worst.Key, worst.Advice.Reason)
		}
	}
	return out, nil
}

func severity(action string) int {
	switch pacer.Action(action) {
	case pacer.Pause:
		return 2
	case pacer.SlowDown:
		return 1
	}
	return 0
}

// newKeyStatus is k's status as the tools and the REST side show it: the
// pacer's st in whole seconds (rounded up), with the binding budget marked, at most
// MaxUpstream upstream budgets (the least left first), and whether k's
// credential can be read.
func newKeyStatus(k *keystore.Key, st pacer.KeyStatus, now time.Time) KeyStatus {
	ks := KeyStatus{Key: k.Name, Credential: "ok", Local: []Local{}, Upstream: []Upstream{}, InFlight: st.InFlight,
		Quota: NewQuota(k.Name, st.Binding), Advice: NewAdvice(st.Advice)}
	if _, err := k.Credential(); err != nil {
		ks.Credential = err.Error()
	}
	binds := func(b pacer.Budget) bool {
		x := st.Binding
		return x != nil && x.Policy == b.Policy && x.Source == b.Source && x.Partition == b.Partition && x.Unit == b.Unit
	}
	for _, b := range st.Local {
		ks.Local = append(ks.Local, Local{Policy: b.Policy, Unit: string(b.Unit), Limit: b.Limit, Used: b.Used, Remaining: b.Remaining,
			ResetS: Seconds(b.Reset), WindowS: Seconds(b.Window), Binds: binds(b)})
	}
	upstream := st.Upstream
	if len(upstream) > MaxUpstream {
		upstream = slices.Clone(upstream)
		slices.SortStableFunc(upstream, func(a, b pacer.Budget) int { return cmp.Compare(budgetLeft(a), budgetLeft(b)) })
		ks.UpstreamNotShown = len(upstream) - MaxUpstream
		upstream = upstream[:MaxUpstream]
	}
	for _, b := range upstream {
		ks.Upstream = append(ks.Upstream, Upstream{Policy: b.Policy, Unit: string(b.Unit), Partition: b.Partition,
			Q: b.Limit, W: Seconds(b.Window), R: b.Remaining, T: Seconds(b.Reset),
			ObservedAt: b.Observed.UTC().Format(time.RFC3339), AgeS: int64(now.Sub(b.Observed).Seconds()),
			Expired: b.Expired, Hidden: b.Hidden, Source: b.Source, Counted: b.Counted, Binds: binds(b)})
	}
	if len(st.Gates) > 0 {
		g := st.Gates[0] // the latest to open
		ks.RetryAfter = &Gate{Until: g.Until.UTC().Format(time.RFC3339), RetryAfterS: Seconds(g.Until.Sub(now)),
			Source: string(g.Source), Reason: g.Reason.String()}
	}
	for _, r := range st.Reserves {
		ks.Reservations = append(ks.Reservations, Reservation{Caller: r.Caller, Share: r.Share})
	}
	for _, w := range st.Warnings {
		ks.Warnings = append(ks.Warnings, w.Reason.String())
	}
	return ks
}
