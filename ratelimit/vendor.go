package ratelimit

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Vendor X-RateLimit-* fields mean only what the key's profile says they
// mean: each profile reads its own field names, and no other profile reads
// them. The grammar each reads is quoted on its function; counts are
//
//	count = 1*DIGIT
//
// unless the function says otherwise, and a negative count (Azure's -1)
// means "unknown", never "exhausted": the field is ignored with a warning.

// readVendor reads the fields of rd.p (see profileTable).
func (rd *reader) readVendor() {
	if f := rd.row().vendor; f != nil {
		f(rd)
	}
}

// count reads a count field. ok is false when it is absent or invalid
// (with a warning).
func (rd *reader) count(name string) (int64, bool) {
	v, ok := rd.scalar(name)
	if !ok {
		return 0, false
	}
	if n, ok := parseCount(v); ok {
		return n, true
	}
	if s := strings.TrimSpace(v); strings.HasPrefix(s, "-") {
		rd.warnf("%s: negative %s means unknown, ignored", name, quote(v))
	} else {
		rd.warnf("%s: not a non-negative integer %s, ignored", name, quote(v))
	}
	return 0, false
}

// A resetFunc reads a reset field's value under one profile's meaning.
type resetFunc func(name, v string) (d time.Duration, guessed, ok bool)

// deltaReset reads delta-seconds:
//
//	reset = 1*DIGIT
func (rd *reader) deltaReset(name, v string) (time.Duration, bool, bool) {
	n, ok := parseCount(v)
	if !ok {
		rd.warnf("%s: not delta-seconds %s, ignored", name, quote(v))
		return 0, false, false
	}
	d, clamped := seconds(n)
	if clamped {
		rd.warnf("%s: %s clamped to %v", name, quote(v), d)
	}
	return d, false, true
}

// epochReset reads Unix epoch seconds, possibly fractional (Discord),
// measured against the response's Date or the receive time (readDate):
//
//	reset = 1*DIGIT [ "." 1*DIGIT ]
//
// A whole number names a second, not an instant: the window may end
// anywhere in it, so the reset is read as the end of that second (as
// octokit reads GitHub's).
func (rd *reader) epochReset(name, v string) (time.Duration, bool, bool) {
	f, ok := parseDecimal(v)
	t, okT := epochTime(f)
	if !ok || !okT {
		rd.warnf("%s: not epoch seconds %s, ignored", name, quote(v))
		return 0, false, false
	}
	if !strings.Contains(v, ".") {
		t = t.Add(time.Second)
	}
	return rd.untilInstant(name, v, t), false, true
}

// timestampReset reads an RFC 3339 timestamp (Anthropic) or Jira's
// minute-precision ISO 8601 form, measured against the response's Date or
// the receive time (readDate).
func (rd *reader) timestampReset(name, v string) (time.Duration, bool, bool) {
	t, ok := parseTimestamp(v)
	if !ok {
		rd.warnf("%s: not an RFC 3339 timestamp %s, ignored", name, quote(v))
		return 0, false, false
	}
	return rd.untilInstant(name, v, t), false, true
}

// untilInstant returns the time from the response's Date to t; an instant
// in the past reads as 0s, with a warning.
func (rd *reader) untilInstant(name, v string, t time.Time) time.Duration {
	d, past, clamped := until(t, rd.resetRef)
	switch {
	case past:
		rd.warnf("%s: %s is in the past, read as 0s", name, quote(v))
	case clamped:
		rd.warnf("%s: %s is absurdly far ahead, clamped", name, quote(v))
	}
	return d
}

// guessedReset reads a reset of unknown meaning (Generic): a date when it
// is one (HTTP-date, RFC 3339), else a number whose meaning is guessed by
// magnitude — below 1e9 delta seconds, 1e9 to 1e11 epoch seconds, 1e12 to
// 1e14 epoch milliseconds; an epoch more than 7 days from the response's
// Date is not plausible and is ignored. A guess is marked and warned.
func (rd *reader) guessedReset(name, v string) (time.Duration, bool, bool) {
	d, guessed, warn, ok := parseGuessedReset(name, v, rd.resetRef)
	if warn != "" {
		rd.warnf("%s", warn)
	}
	return d, guessed, ok
}

// parseGuessedReset reads a vendor's reset field (name, value v), which
// may be an HTTP-date, a timestamp, seconds to wait, or an epoch in
// seconds or milliseconds (the last three told apart by magnitude), as
// the time from ref until the reset; guessed says it was read as an
// epoch; warn says what was made of a value in the past, a guess, or a
// value not read.
func parseGuessedReset(name, v string, ref time.Time) (d time.Duration, guessed bool, warn string, ok bool) {
	s := strings.TrimSpace(v)
	if t, ok := parseHTTPDate(s); ok {
		d, past, _ := until(t, ref)
		if past {
			return 0, false, fmt.Sprintf("%s: date %s is in the past, read as 0s", name, quote(s)), true
		}
		return d, false, "", true
	}
	if t, ok := parseTimestamp(s); ok {
		d, past, _ := until(t, ref)
		if past {
			return 0, false, fmt.Sprintf("%s: timestamp %s is in the past, read as 0s", name, quote(s)), true
		}
		return d, false, "", true
	}
	f, ok := parseDecimal(s)
	if !ok {
		return 0, false, fmt.Sprintf("%s: not a number or a date %s, ignored", name, quote(s)), false
	}
	switch classify(f) {
	case magDelta:
		d, _ = floatSeconds(math.Ceil(f))
		return d, true, fmt.Sprintf("%s: %s read as delta seconds (guessed by magnitude)", name, quote(s)), true
	case magEpochSeconds, magEpochMillis:
		t, ok := guessEpoch(f, ref)
		if !ok {
			return 0, false, fmt.Sprintf("%s: %s looks like an epoch but is more than 7 days from the response's Date, ignored", name, quote(s)), false
		}
		d, past, _ := until(t, ref)
		if past {
			return 0, true, fmt.Sprintf("%s: %s read as an epoch (guessed by magnitude), in the past: 0s", name, quote(s)), true
		}
		return d, true, fmt.Sprintf("%s: %s read as an epoch (guessed by magnitude): %v", name, quote(s), d), true
	}
	return 0, false, fmt.Sprintf("%s: %s is neither delta seconds nor an epoch, ignored", name, quote(s)), false
}

// readXRateLimit reads X-RateLimit-Limit/-Remaining/-Reset, the shape the
// reference API (IETF) and most generic servers send. X-RateLimit-Limit may
// also carry quota policies in the draft-03 list form ("10, 10;w=60", as
// Envoy sends it, or "window=" as WHOOP does).
func (rd *reader) readXRateLimit(p Profile, reset resetFunc) {
	var l legacyLimit
	var policies []legacyPolicy
	if v, ok := rd.scalar("X-RateLimit-Limit"); ok {
		if n, ok := parseCount(v); ok {
			l.quota, l.hasQuota = n, true
		} else if q, ps, warns, ok := parseLegacyLimit("X-RateLimit-Limit", []string{v}); ok {
			l.quota, l.hasQuota, policies = q, true, ps
			rd.warnAll(warns)
		} else {
			rd.warnf("X-RateLimit-Limit: not a non-negative integer %s, ignored", quote(v))
		}
	}
	l.remaining, l.hasRemaining = rd.count("X-RateLimit-Remaining")
	if v, ok := rd.scalar("X-RateLimit-Reset"); ok {
		l.reset, l.guessed, l.hasReset = reset("X-RateLimit-Reset", v)
	}
	rd.entries = append(rd.entries, legacyObservations(l, policies, ShapeVendor, p)...)
}

// readGitHub reads GitHub's fields (docs.github.com, "Rate limits for the
// REST API"):
//
//	x-ratelimit-limit, x-ratelimit-remaining : count
//	x-ratelimit-reset    : UTC epoch seconds
//	x-ratelimit-resource : the partition ("core", "search", "graphql", …)
//
// A 403 or 429 is a rate-limit refusal when x-ratelimit-remaining is 0
// (primary) or when the body says it is a secondary rate limit (message
// "…secondary rate limit…" or a documentation_url ending in
// secondary-rate-limits or #abuse-rate-limits), or when it carries
// Retry-After. A secondary refusal without Retry-After waits the docs'
// "at least one minute": 60 s, or until x-ratelimit-reset if later and
// x-ratelimit-remaining is 0.
func (rd *reader) readGitHub() {
	o := Observation{Shape: ShapeVendor, Profile: GitHub}
	o.Quota, o.HasQuota = rd.count("X-RateLimit-Limit")
	o.Remaining, o.HasRemaining = rd.count("X-RateLimit-Remaining")
	if v, ok := rd.scalar("X-RateLimit-Reset"); ok {
		o.Reset, _, o.HasReset = rd.epochReset("X-RateLimit-Reset", v)
	}
	if v, ok := rd.scalar("X-RateLimit-Resource"); ok {
		o.Partition = boundedText(v)
	}
	if o.HasQuota || o.HasRemaining || o.HasReset {
		rd.add(o, false)
	}
	if rd.resp.Status != 403 && rd.resp.Status != 429 {
		return
	}
	exhausted := o.HasRemaining && o.Remaining == 0
	if exhausted {
		rd.r.Throttled = true
	}
	msg, _ := rd.doc.str("message")
	doc, _ := rd.doc.str("documentation_url")
	secondary := strings.Contains(strings.ToLower(msg), "secondary rate limit") ||
		strings.HasSuffix(doc, "secondary-rate-limits") || strings.Contains(doc, "#abuse-rate-limits")
	if !secondary && !(rd.resp.Status == 403 && rd.r.HasRetryAfter) {
		if strings.Contains(strings.ToLower(msg), "rate limit exceeded") {
			rd.r.Throttled = true
		}
		return
	}
	rd.r.Throttled = true
	rd.r.Secondary = !exhausted
	if rd.r.HasRetryAfter {
		return
	}
	d := time.Minute
	if exhausted && o.HasReset {
		d = max(d, min(o.Reset, MaxRetryAfter))
	}
	rd.r.RetryAfter, rd.r.HasRetryAfter = d, true
	rd.warnf("GitHub secondary rate limit without Retry-After: a default wait of %v (at least one minute, per GitHub's docs)", d)
}

// boundedText returns a vendor's partition or policy name, trimmed and
// bounded in length.
func boundedText(v string) string {
	v = strings.TrimSpace(v)
	if len(v) > 128 {
		v = v[:128]
	}
	return v
}

// readDiscord reads Discord's fields (docs.discord.com, "Rate Limits"):
//
//	X-RateLimit-Limit, X-RateLimit-Remaining : count
//	X-RateLimit-Reset       : epoch seconds, may be fractional
//	X-RateLimit-Reset-After : seconds, may be fractional (preferred: no clock needed)
//	X-RateLimit-Bucket      : the partition
//	X-RateLimit-Global      : "true" on a global-limit 429
//	X-RateLimit-Scope       : "user" / "global" / "shared"
//
// and, in readRetryAfter, the 429 body's retry_after (float seconds).
func (rd *reader) readDiscord() {
	o := Observation{Shape: ShapeVendor, Profile: Discord}
	o.Quota, o.HasQuota = rd.count("X-RateLimit-Limit")
	o.Remaining, o.HasRemaining = rd.count("X-RateLimit-Remaining")
	if v, ok := rd.scalar("X-RateLimit-Reset-After"); ok {
		if f, ok := parseDecimal(v); ok {
			o.Reset, _ = floatSeconds(f)
			o.HasReset = true
		} else {
			rd.warnf("X-RateLimit-Reset-After: not a non-negative number of seconds %s, ignored", quote(v))
		}
	}
	if v, ok := rd.scalar("X-RateLimit-Reset"); ok && !o.HasReset {
		o.Reset, _, o.HasReset = rd.epochReset("X-RateLimit-Reset", v)
	}
	if v, ok := rd.scalar("X-RateLimit-Bucket"); ok {
		o.Partition = boundedText(v)
	}
	scope, _ := rd.scalar("X-RateLimit-Scope")
	global, _ := rd.scalar("X-RateLimit-Global")
	if strings.EqualFold(strings.TrimSpace(global), "true") || strings.EqualFold(strings.TrimSpace(scope), "global") {
		o.Policy = "global"
		if rd.resp.Status == 429 {
			rd.warnf("Discord global rate limit: the wait applies to every route of the key")
		}
	}
	if strings.EqualFold(strings.TrimSpace(scope), "shared") && rd.resp.Status == 429 {
		rd.warnf("Discord shared-resource rate limit: not counted against the key, but the wait applies")
	}
	if o.HasQuota || o.HasRemaining || o.HasReset {
		rd.add(o, false)
	}
}

// readReddit reads Reddit's fields (r/redditdev, "Formal ratelimiting
// headers"; praw-dev/prawcore):
//
//	X-Ratelimit-Used      : count
//	X-Ratelimit-Remaining : decimal, e.g. 596.0 (rounded down)
//	X-Ratelimit-Reset     : seconds to the end of the period (decimal rounded up)
//
// Quota is Used + Remaining when both are sent.
func (rd *reader) readReddit() {
	o := Observation{Shape: ShapeVendor, Profile: Reddit}
	used, hasUsed := rd.count("X-Ratelimit-Used")
	if v, ok := rd.scalar("X-Ratelimit-Remaining"); ok {
		if f, ok := parseDecimal(v); ok && f < 1e15 {
			o.Remaining, o.HasRemaining = int64(f), true
		} else {
			rd.warnf("X-Ratelimit-Remaining: not a non-negative number %s, ignored", quote(v))
		}
	}
	if v, ok := rd.scalar("X-Ratelimit-Reset"); ok {
		if f, ok := parseDecimal(v); ok {
			o.Reset, _ = floatSeconds(math.Ceil(f))
			o.HasReset = true
		} else {
			rd.warnf("X-Ratelimit-Reset: not delta seconds %s, ignored", quote(v))
		}
	}
	if hasUsed && o.HasRemaining && used < 1e15 {
		o.Quota, o.HasQuota = used+o.Remaining, true
	}
	if o.HasQuota || o.HasRemaining || o.HasReset {
		rd.add(o, true)
	}
}

// readJira reads Jira Cloud's fields (developer.atlassian.com, "Rate
// limiting"):
//
//	X-RateLimit-Limit, X-RateLimit-Remaining : count
//	X-RateLimit-Reset : ISO 8601, minute precision (yyyy-MM-ddTHH:mmZ)
//	RateLimit-Reason  : the limiter, e.g. jira-burst-based (the policy)
//
// and, in readDraft, Beta-RateLimit-Policy and Beta-RateLimit (draft-11
// syntax), whose exhausted policies
//
//	X-Beta-RateLimit-Reset : ISO 8601, minute precision, when they reset
//
// holds exhausted until that instant when it is later than their t. An
// instant in the past (Atlassian has been seen sending one) is warned and
// ignored.
func (rd *reader) readJira() {
	rd.readJiraBetaReset()
	o := Observation{Shape: ShapeVendor, Profile: Jira}
	o.Quota, o.HasQuota = rd.count("X-RateLimit-Limit")
	o.Remaining, o.HasRemaining = rd.count("X-RateLimit-Remaining")
	if v, ok := rd.scalar("X-RateLimit-Reset"); ok {
		o.Reset, _, o.HasReset = rd.timestampReset("X-RateLimit-Reset", v)
	}
	if v, ok := rd.scalar("RateLimit-Reason"); ok {
		o.Policy = boundedText(v)
	}
	if o.HasQuota || o.HasRemaining || o.HasReset {
		rd.add(o, false)
	}
}

// readJiraBetaReset applies X-Beta-RateLimit-Reset to the exhausted
// policies of the Beta- draft fields (see readJira).
func (rd *reader) readJiraBetaReset() {
	const name = "X-Beta-RateLimit-Reset"
	v, ok := rd.scalar(name)
	if !ok {
		return
	}
	t, ok := parseTimestamp(v)
	if !ok {
		rd.warnf("%s: not an ISO 8601 timestamp %s, ignored", name, quote(v))
		return
	}
	d, past, _ := until(t, rd.resetRef)
	if past {
		rd.warnf("%s: %s is in the past, ignored", name, quote(v))
		return
	}
	for i := range rd.entries {
		e := &rd.entries[i]
		if e.Profile != Jira || e.Shape != ShapeDraft || !e.HasRemaining || e.Remaining > 0 {
			continue
		}
		if !e.HasReset || d > e.Reset {
			e.Reset, e.HasReset = d, true
		}
	}
}
