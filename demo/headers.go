package demo

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// This file is the only one in the package that writes response header
// fields. The demo imitates third-party APIs, so it writes their vendor
// formats itself instead of going through mcp-quota's own header code.

// liarValue is what Liar claims for every quota, remaining and window.
const liarValue = 1000000

// setLimitHeaders sets the rate-limit fields that mode sends for the
// decision d, made at now: the policy and remaining fields on every
// answer, and Retry-After on a refusal where the mode sends one.
//
// Formats (draft-ietf-httpapi-ratelimit-headers, Structured Field lists):
//
//	RateLimit-Policy: "default";q=120;w=60
//	RateLimit: "default";r=117;t=42
//	X-RateLimit-Limit: 120          (FixedWindow, Sliding, Liar)
//	X-RateLimit-Remaining: 117
//	X-RateLimit-Reset: 42           (delta seconds)
//	X-RateLimit-Reset: 1767225642   (GitHubStyle: Unix epoch seconds)
//	Retry-After: 18                 (delay-seconds, rounded up)
//
// t and delta resets are the seconds until r next grows, rounded up.
func setLimitHeaders(h http.Header, mode Mode, d decision, now time.Time) {
	switch mode {
	case FixedWindow, Sliding:
		p := d.policies[0]
		h.Set("RateLimit-Policy", policyItem(p))
		h.Set("RateLimit", limitItem(p, now))
		setXRateLimit(h, p.quota, p.remaining, seconds(p.reset.Sub(now)))
	case HiddenLong:
		items := make([]string, len(d.policies))
		for i, p := range d.policies {
			items[i] = policyItem(p)
		}
		h.Set("RateLimit-Policy", strings.Join(items, ", "))
		h.Set("RateLimit", limitItem(d.policies[closest(d.policies)], now))
	case GitHubStyle:
		p := d.policies[0]
		h.Set("X-RateLimit-Limit", strconv.Itoa(p.quota))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(p.remaining))
		h.Set("X-RateLimit-Used", strconv.Itoa(p.quota-p.remaining))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(epochCeil(p.reset), 10))
		h.Set("X-RateLimit-Resource", "core")
	case Liar:
		h.Set("RateLimit-Policy", fmt.Sprintf(`"default";q=%d;w=1`, liarValue))
		h.Set("RateLimit", fmt.Sprintf(`"default";r=%d;t=1`, liarValue))
		setXRateLimit(h, liarValue, liarValue, 1)
	case RetryAfterOnly, Silent:
	}
	if !d.allowed && mode != GitHubStyle && mode != Silent {
		h.Set("Retry-After", strconv.FormatInt(seconds(d.retryAfter), 10))
	}
}

func policyItem(p status) string {
	return fmt.Sprintf("%q;q=%d;w=%d", p.name, p.quota, seconds(p.window))
}

func limitItem(p status, now time.Time) string {
	return fmt.Sprintf("%q;r=%d;t=%d", p.name, p.remaining, seconds(p.reset.Sub(now)))
}

func setXRateLimit(h http.Header, limit, remaining int, reset int64) {
	h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
}

// epochCeil returns t in Unix seconds, rounded up.
func epochCeil(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// setAuthenticate sets the challenge of a 401.
func setAuthenticate(h http.Header) {
	h.Set("WWW-Authenticate", `Bearer realm="demo"`)
}

func setContentType(h http.Header, mediaType string) {
	h.Set("Content-Type", mediaType)
}

// setETag sets a strong entity tag; tag is its opaque part, unquoted.
func setETag(h http.Header, tag string) {
	h.Set("ETag", `"`+tag+`"`)
}

// setNextLink sets the RFC 8288 link to the next page.
func setNextLink(h http.Header, target string) {
	h.Set("Link", "<"+target+`>; rel="next"`)
}

func setLocation(h http.Header, target string) {
	h.Set("Location", target)
}

func setAllow(h http.Header, methods ...string) {
	h.Set("Allow", strings.Join(methods, ", "))
}
