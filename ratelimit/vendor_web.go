package ratelimit

import (
	"strings"
	"time"
)

// readX reads the X (Twitter) API v2's fields (docs.x.com, "Rate
// limits"), each window a policy of its own:
//
//	x-rate-limit-limit, x-rate-limit-remaining : count
//	x-rate-limit-reset : Unix epoch seconds          ; the endpoint's window (policy "endpoint")
//	x-user-limit-24hour-{limit,remaining,reset}      ; policy "user-24hour", w = 24 h
//	x-app-limit-24hour-{limit,remaining,reset}       ; policy "app-24hour", w = 24 h
//
// A 429 can come from any of them; the exhausted window (remaining 0) is
// the one whose reset binds, even when another resets sooner — the
// pacer waits for every window a response shows exhausted.
func (rd *reader) readX() {
	for _, c := range []struct {
		prefix, policy string
		w              time.Duration
	}{
		{"x-rate-limit-", "endpoint", 0},
		{"x-user-limit-24hour-", "user-24hour", 24 * time.Hour},
		{"x-app-limit-24hour-", "app-24hour", 24 * time.Hour},
	} {
		rd.readTriple(c.prefix, Observation{Policy: c.policy, Window: c.w, Shape: ShapeVendor, Profile: X}, rd.epochReset)
	}
}

// readTriple reads one policy's prefix+"limit" and prefix+"remaining"
// (counts) and prefix+"reset" (by reset) into o, and adds it when any of
// them was sent.
func (rd *reader) readTriple(prefix string, o Observation, reset resetFunc) {
	o.Quota, o.HasQuota = rd.count(prefix + "limit")
	o.Remaining, o.HasRemaining = rd.count(prefix + "remaining")
	if v, ok := rd.scalar(prefix + "reset"); ok {
		o.Reset, _, o.HasReset = reset(prefix+"reset", v)
	}
	if o.HasQuota || o.HasRemaining || o.HasReset {
		rd.add(o, false)
	}
}

// kongPeriods are the periods of Kong's rate-limiting plugin, with their
// windows (0 for the calendar's month and year) and the start of the
// next window after t. Kong counts fixed windows aligned to the UTC
// calendar (kong/tools/timestamp.lua, get_timestamps).
var kongPeriods = []struct {
	name string
	w    time.Duration
	next func(t time.Time) time.Time
}{
	{"second", time.Second, func(t time.Time) time.Time { return t.Truncate(time.Second).Add(time.Second) }},
	{"minute", time.Minute, func(t time.Time) time.Time { return t.Truncate(time.Minute).Add(time.Minute) }},
	{"hour", time.Hour, func(t time.Time) time.Time { return t.Truncate(time.Hour).Add(time.Hour) }},
	{"day", 24 * time.Hour, func(t time.Time) time.Time {
		y, m, d := t.Date()
		return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
	}},
	{"month", 0, func(t time.Time) time.Time { return time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC) }},
	{"year", 0, func(t time.Time) time.Time { return time.Date(t.Year()+1, 1, 1, 0, 0, 0, 0, time.UTC) }},
}

// readKong reads Kong's rate-limiting plugin (developer.konghq.com,
// "Rate Limiting"), one policy per configured period:
//
//	X-RateLimit-Limit-<Period>, X-RateLimit-Remaining-<Period> : count
//	Period = Second / Minute / Hour / Day / Month / Year
//
// Kong sends no reset per period: its windows are fixed and aligned to
// the UTC calendar, so t is the time from the response's Date (or the
// receive time, see readDate) to the next period's start. The
// RateLimit-Limit/-Remaining/-Reset fields Kong also sends are read as
// the draft's, under every profile.
func (rd *reader) readKong() {
	ref := rd.resetRef.UTC()
	for _, p := range kongPeriods {
		suffix := "-" + strings.ToUpper(p.name[:1]) + p.name[1:]
		o := Observation{Policy: p.name, Window: p.w, Shape: ShapeVendor, Profile: Kong}
		o.Quota, o.HasQuota = rd.count("X-RateLimit-Limit" + suffix)
		o.Remaining, o.HasRemaining = rd.count("X-RateLimit-Remaining" + suffix)
		if !o.HasQuota && !o.HasRemaining {
			continue
		}
		o.Reset, o.HasReset = p.next(ref).Sub(ref), true
		rd.add(o, false)
	}
}

// readSlack reads the Web API's refusals (docs.slack.dev, "Rate
// limits"): {"ok": false, "error": "ratelimited"} marks one, on a 429 or,
// for some methods, a 200. Slack's tiers hold per method and workspace,
// and its 429 carries only Retry-After: that wait is recorded as an
// exhausted PerRoute policy "method" (RetryAfterPerRoute), so that the
// method that was refused waits and the key's other methods do not.
func (rd *reader) readSlack() {
	var ok bool
	if unmarshalStrict(rd.doc.raw("ok"), &ok) && !ok {
		if e, _ := rd.doc.str("error"); e == "ratelimited" || e == "rate_limited" {
			rd.r.Throttled = true
		}
	}
	if rd.resp.Status == 429 && rd.r.HasRetryAfter {
		rd.add(Observation{Policy: "method", Remaining: 0, HasRemaining: true, Reset: rd.r.RetryAfter, HasReset: true,
			Shape: ShapeRetry, Profile: Slack, PerRoute: true}, false)
		rd.r.RetryAfterPerRoute = true
	}
}

// readStripe reads Stripe's 429 (docs.stripe.com, "Rate limits"): no
// rate-limit fields on success and no Retry-After, but
//
//	Stripe-Rate-Limited-Reason = "global-rate" / "endpoint-rate" /
//	    "global-concurrency" / "endpoint-concurrency" / "resource-specific"
//
// names the limiter that refused, and Stripe-Should-Retry (read with the
// waits) whether a retry is safe. The reason is warned; the refusal backs
// off as one without guidance. A 429 whose body's error.code is
// lock_timeout is an object lock, not a rate limit: warned as such.
func (rd *reader) readStripe() {
	if rd.resp.Status != 429 {
		return
	}
	if v, ok := rd.scalar("Stripe-Rate-Limited-Reason"); ok {
		rd.r.Throttled = true
		reason := boundedText(v)
		switch reason {
		case "global-rate", "endpoint-rate", "global-concurrency", "endpoint-concurrency", "resource-specific":
			rd.warnf("Stripe rate limiter %s refused the call; it sends no wait, so calls back off", quote(reason))
		default:
			rd.warnf("Stripe-Rate-Limited-Reason: unknown reason %s; calls back off", quote(reason))
		}
	}
	var e struct{ Code string }
	if unmarshalStrict(rd.doc.raw("error"), &e) && e.Code == "lock_timeout" {
		rd.warnf("Stripe 429 lock_timeout: another request holds the object, not a rate limit; retry with the same Idempotency-Key")
	}
}
