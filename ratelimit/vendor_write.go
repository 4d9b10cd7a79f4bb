package ratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// An Announcement is what an intermediary tells its caller about a key's
// shared budget on one answer (see WriteFields). The zero value announces
// nothing and keeps no vendor field.
type Announcement struct {
	// Profile names the vendor fields the caller's SDK reads.
	Profile Profile
	// Limits is the shared budget as the caller meets it now: every
	// policy that binds the key, in any unit. Limits learned from
	// refusals and never announced by the upstream belong in Wait, not
	// here.
	Limits []Limit
	// Wait is the answer's Retry-After: nothing may be sent before it.
	// 0 when there is none.
	Wait time.Duration
	// Secondary says that Wait holds no spent quota (GitHub's secondary
	// limits, a backoff): the vendor's counts the upstream sent pass as
	// they came (those written from Limits are not zeroed), and only
	// Retry-After (and the IETF fields) carry the wait.
	Secondary bool
	// Now is when the answer goes out; epoch and timestamp resets are
	// written from it.
	Now time.Time
}

// resetFormat is how a vendor writes when a limit resets.
type resetFormat int

const (
	deltaSeconds resetFormat = iota // 42 (rounded up)
	epochSeconds                    // 1796153607 (rounded up: not before the end of that second)
	epochMillis                     // 1796153607.250 (Discord)
	goDuration                      // 6m0s, 1.5s, 20ms (OpenAI)
	rfc3339                         // 2026-12-01T20:00:05Z (Anthropic, rounded up)
	isoMinute                       // 2026-12-01T20:01Z (Jira, rounded up)
)

// A fieldSet is one limit as a vendor states it: three fields (and a few
// companions) in the vendor's names and formats.
type fieldSet struct {
	unit       Unit // Requests when empty
	limit      string
	remaining  string
	reset      string
	format     resetFormat
	used       string // limit - remaining (GitHub, GitLab's RateLimit-Observed)
	resetAfter string // fractional delta seconds beside reset (Discord)
	resetTime  string // an HTTP-date beside reset (GitLab)
	resource   string // the partition, written from Limit.Partition (GitHub)
}

// vendorFields holds, per profile, the limits its own fields state, in
// the order they are written. A profile without a row (Generic, IETF,
// Google, Slack, Stripe) states its limits in the reference API's
// X-RateLimit-* fields.
var vendorFields = map[Profile][]fieldSet{
	GitHub: {{limit: "X-Ratelimit-Limit", remaining: "X-Ratelimit-Remaining", reset: "X-Ratelimit-Reset", format: epochSeconds,
		used: "X-Ratelimit-Used", resource: "X-Ratelimit-Resource"}},
	OpenAI: {
		{unit: Requests, limit: "X-Ratelimit-Limit-Requests", remaining: "X-Ratelimit-Remaining-Requests", reset: "X-Ratelimit-Reset-Requests", format: goDuration},
		{unit: Tokens, limit: "X-Ratelimit-Limit-Tokens", remaining: "X-Ratelimit-Remaining-Tokens", reset: "X-Ratelimit-Reset-Tokens", format: goDuration},
	},
	Anthropic: {
		{unit: Requests, limit: "Anthropic-Ratelimit-Requests-Limit", remaining: "Anthropic-Ratelimit-Requests-Remaining", reset: "Anthropic-Ratelimit-Requests-Reset", format: rfc3339},
		{unit: Tokens, limit: "Anthropic-Ratelimit-Tokens-Limit", remaining: "Anthropic-Ratelimit-Tokens-Remaining", reset: "Anthropic-Ratelimit-Tokens-Reset", format: rfc3339},
		{unit: InputTokens, limit: "Anthropic-Ratelimit-Input-Tokens-Limit", remaining: "Anthropic-Ratelimit-Input-Tokens-Remaining", reset: "Anthropic-Ratelimit-Input-Tokens-Reset", format: rfc3339},
		{unit: OutputTokens, limit: "Anthropic-Ratelimit-Output-Tokens-Limit", remaining: "Anthropic-Ratelimit-Output-Tokens-Remaining", reset: "Anthropic-Ratelimit-Output-Tokens-Reset", format: rfc3339},
	},
	GitLab: {{limit: "Ratelimit-Limit", remaining: "Ratelimit-Remaining", reset: "Ratelimit-Reset", format: epochSeconds,
		used: "Ratelimit-Observed", resetTime: "Ratelimit-Resettime"}},
	Discord: {{limit: "X-Ratelimit-Limit", remaining: "X-Ratelimit-Remaining", reset: "X-Ratelimit-Reset", format: epochMillis,
		resetAfter: "X-Ratelimit-Reset-After"}},
	Reddit: {{remaining: "X-Ratelimit-Remaining", reset: "X-Ratelimit-Reset", format: deltaSeconds, used: "X-Ratelimit-Used"}},
	Jira:   {{limit: "X-Ratelimit-Limit", remaining: "X-Ratelimit-Remaining", reset: "X-Ratelimit-Reset", format: isoMinute}},
	X:      {{limit: "X-Rate-Limit-Limit", remaining: "X-Rate-Limit-Remaining", reset: "X-Rate-Limit-Reset", format: epochSeconds}},
}

// ownFields are the rate-limit fields of a profile that pass through
// WriteFields (tightened), beyond vendorFields' sets.
var ownFields = map[Profile]func(name string) bool{
	Discord: func(n string) bool {
		return strings.EqualFold(n, "X-Ratelimit-Bucket") || strings.EqualFold(n, "X-Ratelimit-Global") || strings.EqualFold(n, "X-Ratelimit-Scope")
	},
	GitLab: func(n string) bool { return strings.EqualFold(n, "Ratelimit-Name") },
	Jira:   func(n string) bool { return strings.EqualFold(n, "Ratelimit-Reason") },
	Kong: func(n string) bool {
		return hasPrefixFold(n, "X-Ratelimit-Limit-") || hasPrefixFold(n, "X-Ratelimit-Remaining-")
	},
}

// WriteFields states a's shared budget on an answer whose header h holds
// the upstream's fields (or none, for an answer mcp-quota gives itself):
//
//   - RateLimit-Policy and RateLimit (draft-11 syntax, SetHeaders) list
//     every limit of a.Limits, tokens included;
//   - the profile's own fields (GitHub's epoch reset, used and resource,
//     OpenAI's six, Anthropic's, GitLab's, Discord's, Shopify's, …) pass
//     in the vendor's names, units and formats, made no more generous
//     than the shared budget: a remaining lowered to what every caller
//     together may still spend, a reset moved later, never the other
//     way; when the upstream sent none of them, they are written from
//     a.Limits;
//   - the reference API's X-RateLimit-Limit/-Remaining/-Reset (delta seconds)
//     are written only for a profile that has no fields of its own, or
//     when neither the upstream nor a.Limits gives any.
//
// Every other field StripHeaders names is removed. With a.Wait set,
// every field tells the same story as Retry-After: nothing is left until
// then (a.Secondary keeps the vendor's counts, as GitHub's secondary
// limits do). Limits are read as the caller meets them at a.Now.
func WriteFields(h http.Header, a Announcement) {
	sets := vendorFields[a.Profile]
	keep := ownFields[a.Profile]
	for k := range h {
		if !isLimitName(k) || owns(sets, k) || (keep != nil && keep(k)) {
			continue
		}
		delete(h, k)
	}
	shared := make([]Limit, len(a.Limits))
	for i, l := range a.Limits {
		switch {
		case a.Wait <= 0:
		case l.Remaining > 0: // paced: nothing left until the wait
			l.Remaining, l.Reset = 0, a.Wait
		default: // spent: nothing left until it resets, and not before the wait
			l.Reset = max(l.Reset, a.Wait)
		}
		shared[i] = l
	}
	writeDraft(h, shared)

	vendorLimits := shared
	if a.Secondary {
		vendorLimits = a.Limits
	}
	wrote := false
	present := false
	for _, s := range sets {
		present = present || s.present(h)
	}
	for _, s := range sets {
		switch {
		case present && s.present(h):
			if !a.Secondary { // a secondary refusal's counts pass as they came
				s.tighten(h, vendorLimits, a)
			}
			wrote = true
		case !present:
			wrote = s.write(h, vendorLimits, a) || wrote
		}
	}
	switch a.Profile {
	case Shopify:
		wrote = tightenShopify(h, vendorLimits) || wrote
	case Kong:
		wrote = tightenKong(h, vendorLimits) || wrote
	}
	if !wrote {
		writeXRateLimit(h, shared)
	}
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// writeDraft writes RateLimit-Policy and RateLimit for limits.
func writeDraft(h http.Header, limits []Limit) {
	h.Del("RateLimit-Policy")
	h.Del("RateLimit")
	if len(limits) == 0 {
		return
	}
	policy, current := draftValues(limits)
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", current)
}

// owns reports whether the field name k is one of sets' fields, in any
// case.
func owns(sets []fieldSet, k string) bool {
	for _, s := range sets {
		for _, n := range [...]string{s.limit, s.remaining, s.reset, s.used, s.resetAfter, s.resetTime, s.resource} {
			if n != "" && strings.EqualFold(n, k) {
				return true
			}
		}
	}
	return false
}

// writeXRateLimit writes the reference API's X-RateLimit-* for the tightest
// request-counting limit.
func writeXRateLimit(h http.Header, limits []Limit) {
	t, ok := tightest(limits)
	if !ok {
		return
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(sfInt(t.Quota), 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(sfInt(t.Remaining), 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(t.Reset), 10))
}

// present reports whether h holds any of s's counting fields.
func (s fieldSet) present(h http.Header) bool {
	for _, n := range []string{s.limit, s.remaining, s.reset} {
		if n != "" && len(h.Values(n)) > 0 {
			return true
		}
	}
	return false
}

// binding returns, of limits, the one s states: the same unit (and the
// same partition, when both name one), lowest Remaining, ties going to
// the longest Reset.
func (s fieldSet) binding(limits []Limit, partition string) (best Limit, ok bool) {
	unit := s.unit
	if unit == "" {
		unit = Requests
	}
	for _, l := range limits {
		u := l.Unit
		if u == "" {
			u = Requests
		}
		if u != unit || (partition != "" && l.Partition != "" && !strings.EqualFold(l.Partition, partition)) {
			continue
		}
		if !ok || l.Remaining < best.Remaining || (l.Remaining == best.Remaining && l.Reset > best.Reset) {
			best, ok = l, true
		}
	}
	return best, ok
}

// tighten lowers the remaining of the upstream's own fields to the shared
// budget's and moves their reset later to match; a limit the upstream
// states is never raised.
func (s fieldSet) tighten(h http.Header, limits []Limit, a Announcement) {
	partition := ""
	if s.resource != "" {
		partition = strings.TrimSpace(h.Get(s.resource))
	}
	b, ok := s.binding(limits, partition)
	if !ok || s.remaining == "" {
		return
	}
	v, hasRem := vendorNumber(h.Get(s.remaining))
	rem := max(b.Remaining, 0)
	if hasRem && float64(rem) >= v {
		// The upstream's own count is the tighter; when it is spent, the
		// shared budget may still hold it longer.
		if v <= 0 {
			s.setReset(h, b.Reset, a.Now, true)
		}
		return
	}
	h.Set(s.remaining, strconv.FormatInt(rem, 10))
	if q, ok := vendorNumber(h.Get(s.limit)); ok && s.used != "" {
		used := max(int64(q)-rem, 0)
		if u, ok := vendorNumber(h.Get(s.used)); !ok || float64(used) > u {
			h.Set(s.used, strconv.FormatInt(used, 10))
		}
	}
	s.setReset(h, b.Reset, a.Now, true)
}

// write states b from limits when the upstream sent none of the
// profile's fields; it reports whether it wrote anything.
func (s fieldSet) write(h http.Header, limits []Limit, a Announcement) bool {
	b, ok := s.binding(limits, "")
	if !ok {
		if a.Wait <= 0 || a.Secondary || (s.unit != "" && s.unit != Requests) {
			return false
		}
		// A refusal with no known budget: nothing left until the wait.
		b = Limit{Remaining: 0, Reset: a.Wait}
	}
	if s.limit != "" && b.Quota > 0 {
		h.Set(s.limit, strconv.FormatInt(sfInt(b.Quota), 10))
	}
	if s.remaining != "" {
		h.Set(s.remaining, strconv.FormatInt(sfInt(b.Remaining), 10))
	}
	if s.used != "" && b.Quota > 0 {
		h.Set(s.used, strconv.FormatInt(max(sfInt(b.Quota)-sfInt(b.Remaining), 0), 10))
	}
	if s.resource != "" && b.Partition != "" {
		h.Set(s.resource, sfString(b.Partition))
	}
	s.setReset(h, b.Reset, a.Now, false)
	return true
}

// setReset writes a reset d from now in s's format; with later set, only
// when it is later than the one h holds.
func (s fieldSet) setReset(h http.Header, d time.Duration, now time.Time, later bool) {
	if s.reset == "" {
		return
	}
	d = max(d, 0)
	at := now.Add(d)
	if later {
		if cur, ok := s.readReset(h, now); ok && !at.After(cur) {
			return
		}
	}
	var v string
	switch s.format {
	case deltaSeconds:
		v = strconv.FormatInt(ceilSeconds(d), 10)
	case epochSeconds:
		v = strconv.FormatInt(ceilUnix(at, time.Second), 10)
	case epochMillis:
		v = strconv.FormatFloat(float64(ceilUnix(at, time.Millisecond))/1000, 'f', 3, 64)
	case goDuration:
		v = ceilDuration(d, time.Millisecond).String()
	case rfc3339:
		v = time.Unix(ceilUnix(at, time.Second), 0).UTC().Format(time.RFC3339)
	case isoMinute:
		v = time.Unix(ceilUnix(at, time.Minute)*60, 0).UTC().Format("2006-01-02T15:04Z")
	}
	h.Set(s.reset, v)
	if s.resetAfter != "" {
		h.Set(s.resetAfter, strconv.FormatFloat(ceilDuration(d, time.Millisecond).Seconds(), 'f', 3, 64))
	}
	if s.resetTime != "" {
		h.Set(s.resetTime, time.Unix(ceilUnix(at, time.Second), 0).UTC().Format(http.TimeFormat))
	}
}

// readReset reads the instant s's reset in h names, as the caller would.
func (s fieldSet) readReset(h http.Header, now time.Time) (time.Time, bool) {
	v := strings.TrimSpace(h.Get(s.reset))
	if v == "" {
		return time.Time{}, false
	}
	switch s.format {
	case deltaSeconds:
		if f, ok := parseDecimal(v); ok {
			d, _ := floatSeconds(f)
			return now.Add(d), true
		}
	case epochSeconds, epochMillis:
		if f, ok := parseDecimal(v); ok {
			return epochTime(f)
		}
	case goDuration:
		if d, ok := parseGoDuration(v); ok {
			return now.Add(d), true
		}
	case rfc3339, isoMinute:
		return parseTimestamp(v)
	}
	return time.Time{}, false
}

// vendorNumber reads a count as vendors write it (Reddit writes 596.0).
func vendorNumber(v string) (float64, bool) {
	return parseDecimal(strings.TrimSpace(v))
}

// ceilUnix returns t in units of unit since the epoch, rounded up.
func ceilUnix(t time.Time, unit time.Duration) int64 {
	n := t.UnixNano()
	u := int64(unit)
	q := n / u
	if n%u > 0 {
		q++
	}
	return q
}

// ceilDuration rounds d up to a multiple of unit.
func ceilDuration(d, unit time.Duration) time.Duration {
	if r := d % unit; r > 0 {
		return d - r + unit
	}
	return d
}

// tightenShopify states the shared budget in X-Shopify-Shop-Api-Call-Limit
// (used/size): used raised to size minus what all callers may still
// spend.
func tightenShopify(h http.Header, limits []Limit) bool {
	const name = "X-Shopify-Shop-Api-Call-Limit"
	s := fieldSet{}
	b, ok := s.binding(limits, "")
	v := h.Get(name)
	used, size, okv := parseRatio(v)
	switch {
	case okv && ok:
		if size-b.Remaining > used {
			h.Set(name, strconv.FormatInt(min(size, max(size-b.Remaining, 0)), 10)+"/"+strconv.FormatInt(size, 10))
		}
		return true
	case okv:
		return true
	case ok && b.Quota > 0:
		h.Set(name, strconv.FormatInt(max(b.Quota-b.Remaining, 0), 10)+"/"+strconv.FormatInt(b.Quota, 10))
		return true
	}
	return false
}

// tightenKong lowers every X-RateLimit-Remaining-<Period> Kong sent to
// the shared budget's request count.
func tightenKong(h http.Header, limits []Limit) bool {
	b, ok := fieldSet{}.binding(limits, "")
	found := false
	for k := range h {
		if !hasPrefixFold(k, "X-Ratelimit-Remaining-") {
			continue
		}
		found = true
		if v, okv := vendorNumber(h.Get(k)); ok && okv && float64(b.Remaining) < v {
			h.Set(k, strconv.FormatInt(max(b.Remaining, 0), 10))
		}
	}
	return found
}
