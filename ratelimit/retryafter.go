package ratelimit

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// A wait is one server-directed delay, parsed.
type wait struct {
	d  time.Duration // within [0, MaxRetryAfter] when ok
	ok bool          // a wait was read (possibly leniently, floored or capped)
	// lenient marks a wait read outside its grammar (a mis-cased date, a decimal).
	lenient bool
	warn    string // why the value was read leniently, floored, capped or ignored; "" when clean
}

// parseRetryAfter parses one Retry-After field value (RFC 9110 §10.2.3):
//
//	Retry-After   = HTTP-date / delay-seconds
//	delay-seconds = 1*DIGIT
//
// The HTTP-date form (all three formats of §5.6.7) is measured against
// ref, which is the response's Date when it has a valid one, so a skewed
// local clock cannot shorten the wait. Outcomes outside the grammar:
//
//   - a date in the past: 0, with a warning;
//   - a date not in the grammar's case ("mon, 01 jun 2026 12:01:00 gmt"):
//     read as the instant it names, leniently, with a warning;
//   - a decimal such as "2.0" (Shopify): rounded up to whole seconds,
//     leniently, with a warning;
//   - a negative number, an exponent, any other text: ignored, with a warning;
//   - more than MaxRetryAfter: if the number is a plausible epoch (in
//     seconds or milliseconds, within 7 days of ref) it is read as that
//     instant, otherwise capped to MaxRetryAfter; with a warning either way.
func parseRetryAfter(v string, ref time.Time) wait {
	s := strings.TrimSpace(v)
	switch {
	case s == "":
		return wait{warn: "Retry-After: empty, ignored"}
	case len(s) > maxScalarLen:
		return wait{warn: fmt.Sprintf("Retry-After: not delay-seconds or an HTTP-date %s, ignored", quote(s))}
	}
	if n, ok := parseCount(s); ok {
		return delaySeconds(float64(n), s, ref)
	}
	if isAllDigits(s) { // more digits than an int64 holds
		return wait{d: MaxRetryAfter, ok: true, warn: fmt.Sprintf("Retry-After: %s is absurdly long, capped to %v", quote(s), MaxRetryAfter)}
	}
	if f, ok := parseDecimal(s); ok {
		w := delaySeconds(math.Ceil(f), s, ref)
		if w.warn == "" {
			w.warn = fmt.Sprintf("Retry-After: %s is not an integer, read as %v", quote(s), w.d)
		}
		w.lenient = true
		return w
	}
	if t, lenient, ok := parseHTTPDateLenient(s); ok {
		d, past, _ := until(t, ref)
		var w wait
		switch {
		case past:
			w = wait{ok: true, warn: fmt.Sprintf("Retry-After: date %s is in the past, read as 0s", quote(s))}
		case d > MaxRetryAfter:
			w = wait{d: MaxRetryAfter, ok: true, warn: fmt.Sprintf("Retry-After: date %s is more than %v ahead, capped", quote(s), MaxRetryAfter)}
		default:
			w = wait{d: d, ok: true}
		}
		if lenient {
			w.lenient = true
			if w.warn == "" {
				w.warn = fmt.Sprintf("Retry-After: date %s is not in the HTTP-date's case, read leniently as %v", quote(s), d)
			} else {
				w.warn += " (read leniently: not in the HTTP-date's case)"
			}
		}
		return w
	}
	if s[0] == '-' {
		return wait{warn: fmt.Sprintf("Retry-After: negative %s, ignored", quote(s))}
	}
	return wait{warn: fmt.Sprintf("Retry-After: not delay-seconds or an HTTP-date %s, ignored", quote(s))}
}

// delaySeconds turns a non-negative whole number of seconds into a wait,
// recognising an epoch sent in place of a delay.
func delaySeconds(n float64, raw string, ref time.Time) wait {
	if n <= MaxRetryAfter.Seconds() {
		return wait{d: time.Duration(n) * time.Second, ok: true}
	}
	if t, ok := guessEpoch(n, ref); ok {
		d, past, _ := until(t, ref)
		switch {
		case past:
			return wait{ok: true, warn: fmt.Sprintf("Retry-After: %s read as an epoch in the past, 0s", quote(raw))}
		case d > MaxRetryAfter:
			return wait{d: MaxRetryAfter, ok: true, warn: fmt.Sprintf("Retry-After: %s read as an epoch more than %v ahead, capped", quote(raw), MaxRetryAfter)}
		}
		return wait{d: d, ok: true, warn: fmt.Sprintf("Retry-After: %s is an epoch, not delay-seconds; read as %v", quote(raw), d)}
	}
	if classify(n) != magDelta {
		return wait{d: MaxRetryAfter, ok: true, warn: fmt.Sprintf("Retry-After: %s looks like an epoch but is more than 7 days from the response's Date; capped to %v", quote(raw), MaxRetryAfter)}
	}
	return wait{d: MaxRetryAfter, ok: true, warn: fmt.Sprintf("Retry-After: %s is more than %v, capped", quote(raw), MaxRetryAfter)}
}

// guessEpoch returns the instant n denotes when, by magnitude, it is Unix
// seconds or milliseconds and lies within plausibleEpoch of ref.
func guessEpoch(n float64, ref time.Time) (time.Time, bool) {
	var t time.Time
	var ok bool
	switch classify(n) {
	case magEpochSeconds:
		t, ok = epochTime(n)
	case magEpochMillis:
		t, ok = epochTime(n / 1000)
	}
	if !ok {
		return time.Time{}, false
	}
	if d := t.Sub(ref); d < -plausibleEpoch || d > plausibleEpoch {
		return time.Time{}, false
	}
	return t, true
}

func isAllDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// parseRetryAfterMS parses OpenAI's and Anthropic's retry-after-ms, a
// non-negative number of milliseconds (decimals allowed, as their SDKs
// read it with float()):
//
//	retry-after-ms = 1*DIGIT [ "." 1*DIGIT ]
func parseRetryAfterMS(v string) wait {
	f, ok := parseDecimal(v)
	if !ok {
		return wait{warn: fmt.Sprintf("retry-after-ms: not a non-negative number %s, ignored", quote(v))}
	}
	d, _ := floatSeconds(f / 1000)
	return capWait(d, "retry-after-ms", v)
}

// parseFloatWait reads a wait given as a JSON number of seconds (Discord's
// body retry_after).
func parseFloatWait(f float64, name string) wait {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return wait{warn: fmt.Sprintf("%s: %v is not a non-negative number of seconds, ignored", name, f)}
	}
	d, _ := floatSeconds(f)
	return capWait(d, name, fmt.Sprint(f))
}

// capWait caps d to MaxRetryAfter, with a warning naming the field.
func capWait(d time.Duration, name, raw string) wait {
	if d > MaxRetryAfter {
		return wait{d: MaxRetryAfter, ok: true, warn: fmt.Sprintf("%s: %s is more than %v, capped", name, quote(raw), MaxRetryAfter)}
	}
	return wait{d: d, ok: true}
}

// readRetryAfter reads Retry-After under every profile, the RetryInfo of
// a google.rpc.Status body under every profile, the profile's own variants
// (profileTable's waits: retry-after-ms and x-should-retry for OpenAI and
// Anthropic, the body's retry_after for Discord, Stripe-Should-Retry for
// Stripe and Generic), and last a prose hint in an error body. When
// several waits apply, the longest wins; a hint never shortens another.
func (rd *reader) readRetryAfter() {
	vs := rd.lines("Retry-After")
	if len(vs) > 1 {
		rd.warnf("Retry-After: sent %d times, the longest wait is kept", len(vs))
	}
	for _, v := range vs {
		rd.applyWait(parseRetryAfter(v, rd.ref))
	}
	rd.readGoogleStatus()
	if f := rd.row().waits; f != nil {
		f(rd)
	}
	rd.readProseHint()
}

// readMillisWaits reads OpenAI's and Anthropic's retry-after-ms and
// x-should-retry.
func (rd *reader) readMillisWaits() {
	if v, ok := rd.scalar("Retry-After-Ms"); ok {
		rd.applyWait(parseRetryAfterMS(v))
	}
	rd.readShouldRetry("X-Should-Retry")
}

// readDiscordWait reads the body's retry_after (float seconds) Discord
// sends on a 429.
func (rd *reader) readDiscordWait() {
	if rd.doc != nil && rd.doc.RetryAfter != nil {
		rd.applyWait(parseFloatWait(*rd.doc.RetryAfter, "body retry_after"))
	}
}

// applyWait records w, keeping the longest of several waits.
func (rd *reader) applyWait(w wait) {
	if w.warn != "" {
		rd.warnf("%s", w.warn)
	}
	if !w.ok {
		return
	}
	if w.lenient {
		rd.r.Lenient = true
	}
	if rd.r.HasRetryAfter && w.d > rd.r.RetryAfter {
		rd.r.RetryAfterHint = false // a longer field's wait replaces a hint
	}
	if !rd.r.HasRetryAfter || w.d > rd.r.RetryAfter {
		rd.r.RetryAfter = w.d
	}
	rd.r.HasRetryAfter = true
}

// readShouldRetry reads an explicit retry verdict: "false" sets DoNotRetry.
//
//	x-should-retry = "true" / "false"
func (rd *reader) readShouldRetry(name string) {
	v, ok := rd.scalar(name)
	if !ok {
		return
	}
	switch v = strings.TrimSpace(v); {
	case strings.EqualFold(v, "false"):
		rd.r.DoNotRetry = true
	case strings.EqualFold(v, "true"):
	default:
		rd.warnf("%s: not true or false %s, ignored", name, quote(v))
	}
}
