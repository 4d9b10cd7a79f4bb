package ratelimit

import (
	"math"
	"strings"
	"time"
)

// readOpenAI reads OpenAI's fields (platform.openai.com, "Rate limits"),
// one policy per class, requests and tokens (and the tokens_usage_based
// variant seen in captures):
//
//	x-ratelimit-limit-<class>, x-ratelimit-remaining-<class> : count
//	x-ratelimit-reset-<class> : Go duration, e.g. 1s, 6m0s, 8.64s, 20ms
//
// The reset is the time "until the rate limit resets to its initial
// state". Azure OpenAI's -1 sentinels mean unknown.
func (rd *reader) readOpenAI() {
	for _, c := range []struct {
		class string
		unit  Unit
	}{{"requests", Requests}, {"tokens", Tokens}, {"tokens_usage_based", Tokens}} {
		o := Observation{Policy: c.class, Unit: c.unit, Shape: ShapeVendor, Profile: OpenAI}
		o.Quota, o.HasQuota = rd.count("x-ratelimit-limit-" + c.class)
		o.Remaining, o.HasRemaining = rd.count("x-ratelimit-remaining-" + c.class)
		name := "x-ratelimit-reset-" + c.class
		if v, ok := rd.scalar(name); ok {
			if d, ok := parseGoDuration(v); ok {
				o.Reset, o.HasReset = d, true
			} else if n, ok := parseCount(v); ok {
				o.Reset, _ = seconds(n)
				o.HasReset, o.Guessed = true, n != 0
				if n != 0 {
					rd.warnf("%s: %s has no unit, read as seconds (guessed)", name, quote(v))
				}
			} else {
				rd.warnf("%s: not a duration %s, ignored", name, quote(v))
			}
		}
		if o.HasQuota || o.HasRemaining || o.HasReset {
			rd.add(o, false)
		}
	}
}

// readAnthropic reads Anthropic's fields (docs.anthropic.com, "Rate
// limits"), one policy per class:
//
//	anthropic-ratelimit-<class>-limit, -remaining : count
//	anthropic-ratelimit-<class>-reset : RFC 3339, when the limit is fully replenished
//	class = requests / tokens / input-tokens / output-tokens
//
// and the Priority Tier's anthropic-priority-{input,output}-tokens-*
// (policies "priority-input-tokens", "priority-output-tokens"). Token
// counts are "rounded to the nearest thousand".
func (rd *reader) readAnthropic() {
	for _, c := range []struct {
		prefix, policy string
		unit           Unit
	}{
		{"anthropic-ratelimit-requests-", "requests", Requests},
		{"anthropic-ratelimit-tokens-", "tokens", Tokens},
		{"anthropic-ratelimit-input-tokens-", "input-tokens", InputTokens},
		{"anthropic-ratelimit-output-tokens-", "output-tokens", OutputTokens},
		{"anthropic-priority-input-tokens-", "priority-input-tokens", InputTokens},
		{"anthropic-priority-output-tokens-", "priority-output-tokens", OutputTokens},
	} {
		rd.readTriple(c.prefix, Observation{Policy: c.policy, Unit: c.unit, Shape: ShapeVendor, Profile: Anthropic}, rd.timestampReset)
	}
	rd.readAnthropicUnified()
}

// readAnthropicUnified reads the unified limits of Claude subscription
// (OAuth) traffic (third-party captures: lidge-jun/opencodex PR #3809,
// anthropics/claude-code issue #12829), one policy per window, in
// Percent of a quota Anthropic does not state:
//
//	anthropic-ratelimit-unified-<w>-utilization : decimal, the spent fraction (0.42)
//	anthropic-ratelimit-unified-<w>-reset       : Unix epoch seconds
//	anthropic-ratelimit-unified-<w>-status      : allowed / allowed_warning / rejected
//	w = 5h / 7d
//	anthropic-ratelimit-unified-status, -reset  : the representative window's (policy "unified")
//
// Remaining is what is left of 100 (the spent share rounded up); a
// "rejected" window is 0, and on an error status a refusal: of several
// rejected windows the pacer waits for the latest reset, as all hold.
func (rd *reader) readAnthropicUnified() {
	const prefix = "anthropic-ratelimit-unified-"
	seen := false
	for _, c := range []struct {
		name string
		w    time.Duration
	}{{"5h", 5 * time.Hour}, {"7d", 7 * 24 * time.Hour}} {
		o := Observation{Policy: "unified-" + c.name, Unit: Percent, Window: c.w, Shape: ShapeVendor, Profile: Anthropic}
		if rd.readUnified(prefix+c.name+"-", &o) {
			seen = true
			rd.add(o, false)
		}
	}
	if seen {
		return // the representative window is one of them
	}
	o := Observation{Policy: "unified", Unit: Percent, Shape: ShapeVendor, Profile: Anthropic}
	if rd.readUnified(prefix, &o) {
		rd.add(o, false)
	}
}

// readUnified reads one unified window's fields under prefix into o,
// reporting whether any was sent.
func (rd *reader) readUnified(prefix string, o *Observation) bool {
	sent := false
	if v, ok := rd.scalar(prefix + "utilization"); ok {
		sent = true
		if f, ok := parseDecimal(v); ok {
			if f > 1 {
				rd.warnf("%s: %s is past 1 (all of the window used): read as none left", prefix+"utilization", quote(v))
			}
			o.Quota, o.HasQuota = 100, true
			o.Remaining, o.HasRemaining = max(0, 100-int64(math.Ceil(min(f, 1)*100))), true
		} else {
			rd.warnf("%s: not a fraction %s, ignored", prefix+"utilization", quote(v))
		}
	}
	if v, ok := rd.scalar(prefix + "reset"); ok {
		sent = true
		o.Reset, _, o.HasReset = rd.epochReset(prefix+"reset", v)
	}
	if v, ok := rd.scalar(prefix + "status"); ok {
		sent = true
		switch strings.TrimSpace(v) {
		case "allowed", "allowed_warning":
		case "rejected":
			o.Remaining, o.HasRemaining = 0, true
			if rd.resp.Status >= 400 {
				rd.r.Throttled = true
			}
		default:
			rd.warnf("%s: unknown status %s, ignored", prefix+"status", quote(v))
		}
	}
	return sent
}

// shopifyLeak is the leak rate assumed of a REST bucket until the pacer
// learns the real one from successive answers: the standard plan's 2
// requests per second, the slowest Shopify documents (Advanced leaks 4/s,
// Plus 20/s).
const shopifyLeak = 2.0

// readShopify reads the REST Admin API's leaky bucket (shopify.dev, "REST
// Admin API rate limits"):
//
//	X-Shopify-Shop-Api-Call-Limit = used "/" size   ; e.g. 32/40
//
// as policy "rest" of ShapeLeaky: Quota = size, Remaining = size - used,
// Window the time the bucket drains in and Reset the time one request
// leaks out at the assumed leak rate (shopifyLeak, marked Guessed: the
// pacer learns the real rate from successive answers). The GraphQL cost
// in the body is read by readShopifyCost.
func (rd *reader) readShopify() {
	const name = "X-Shopify-Shop-Api-Call-Limit"
	v, ok := rd.scalar(name)
	if !ok {
		return
	}
	used, size, ok := parseRatio(v)
	if !ok {
		rd.warnf("%s: not used/size %s, ignored", name, quote(v))
		return
	}
	o := Observation{Policy: "rest", Quota: size, HasQuota: true, Remaining: size - used, HasRemaining: true,
		Shape: ShapeLeaky, Profile: Shopify, Guessed: true}
	o.Window, _ = floatSeconds(float64(size) / shopifyLeak)
	o.Reset, o.HasReset = time.Duration(float64(time.Second)/shopifyLeak), true
	if used > size {
		o.Remaining = 0
		rd.warnf("%s: %s uses more than the bucket holds; read as 0 remaining", name, quote(v))
	}
	rd.add(o, false)
}

// parseRatio parses "used/size", two counts around a slash.
func parseRatio(v string) (used, size int64, ok bool) {
	a, b, found := strings.Cut(v, "/")
	if !found {
		return 0, 0, false
	}
	used, ok1 := parseCount(a)
	size, ok2 := parseCount(b)
	return used, size, ok1 && ok2
}

// readGitLab reads GitLab's fields (gitlab.com user docs, "Rate limits";
// issues 217312 and 199738), which reuse the draft's names with another
// meaning:
//
//	RateLimit-Limit, RateLimit-Remaining : count
//	RateLimit-Reset     : Unix epoch seconds (not the draft's delta)
//	RateLimit-ResetTime : HTTP-date, used when RateLimit-Reset is absent or invalid
//	RateLimit-Name      : the throttle, e.g. throttle_authenticated_api (the policy)
//
// A 429 whose RateLimit-Remaining is above 0 (GitLab sends 595 of 600)
// and that has no Retry-After is read with remaining 0: the refusal
// outranks the count, and RateLimit-Reset says when to come back.
func (rd *reader) readGitLab() {
	o := Observation{Shape: ShapeVendor, Profile: GitLab}
	o.Quota, o.HasQuota = rd.count("RateLimit-Limit")
	o.Remaining, o.HasRemaining = rd.count("RateLimit-Remaining")
	if v, ok := rd.scalar("RateLimit-Reset"); ok {
		o.Reset, _, o.HasReset = rd.epochReset("RateLimit-Reset", v)
	}
	if v, ok := rd.scalar("RateLimit-ResetTime"); ok && !o.HasReset {
		if t, ok := parseHTTPDate(v); ok {
			o.Reset, o.HasReset = rd.untilInstant("RateLimit-ResetTime", v, t), true
		} else {
			rd.warnf("RateLimit-ResetTime: not an HTTP-date %s, ignored", quote(v))
		}
	}
	if v, ok := rd.scalar("RateLimit-Name"); ok {
		o.Policy = boundedText(v)
	}
	if rd.resp.Status == 429 && o.HasRemaining && o.Remaining > 0 {
		if o.HasReset && !rd.r.HasRetryAfter {
			// The refusal outranks remaining, and the reset the same
			// answer names is when to come back.
			rd.warnf("GitLab 429 while RateLimit-Remaining is %d: the refusal outranks it, read as 0 until RateLimit-Reset (%v)", o.Remaining, o.Reset)
			o.Remaining = 0
		} else {
			rd.warnf("GitLab 429 while RateLimit-Remaining is %d: another limit refused the call", o.Remaining)
		}
	}
	if o.HasQuota || o.HasRemaining || o.HasReset {
		rd.add(o, false)
	}
}
