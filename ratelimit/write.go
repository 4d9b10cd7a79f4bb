package ratelimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxSFInteger is the largest Integer a Structured Field can carry.
const maxSFInteger = 999_999_999_999_999

// SetHeaders replaces the rate-limit fields of h with limits:
// RateLimit-Policy and RateLimit (draft-11 syntax) list every limit, and
// X-RateLimit-Limit/-Remaining/-Reset describe the tightest one (Reset in
// delta seconds, as the reference API sends it). Durations are rounded up to
// whole seconds. With no limits, it only removes the fields.
//
// For example, one limit of 120 requests per minute with 117 left for 42 s:
//
//	RateLimit-Policy: "default";q=120;w=60
//	RateLimit: "default";r=117;t=42
//	X-RateLimit-Limit: 120
//	X-RateLimit-Remaining: 117
//	X-RateLimit-Reset: 42
//
// Every field StripHeaders removes is removed first, so an upstream's more
// generous value never shows through. A policy name is written as a
// String (characters outside printable ASCII become "_"); qu is written
// only for units other than requests; w only for a positive window.
// Negative values are written as 0. The X- fields describe the tightest
// request-counting limit (lowest Remaining, ties going to the longest
// Reset), because clients read them as request counts; when no limit
// counts requests they are not written.
func SetHeaders(h http.Header, limits []Limit) {
	StripHeaders(h)
	if len(limits) == 0 {
		return
	}
	policy, current := draftValues(limits)
	h.Set("RateLimit-Policy", policy)
	h.Set("RateLimit", current)
	if t, ok := tightest(limits); ok {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(sfInt(t.Quota), 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(sfInt(t.Remaining), 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(t.Reset), 10))
	}
}

// tightest returns the request-counting limit closest to exhaustion:
// the lowest Remaining, ties going to the longest Reset. ok is false when
// no limit counts requests.
func tightest(limits []Limit) (best Limit, ok bool) {
	for _, l := range limits {
		if l.Unit != "" && l.Unit != Requests {
			continue
		}
		if !ok || l.Remaining < best.Remaining || (l.Remaining == best.Remaining && l.Reset > best.Reset) {
			best, ok = l, true
		}
	}
	return best, ok
}

// StripHeaders removes every field of h that states a rate limit in the
// draft's or the common X- form: RateLimit, and every field named
// RateLimit-* or X-RateLimit-* (in any case), including vendor ones such
// as X-RateLimit-Reset-After or RateLimit-Reason. Vendor fields of other
// names (anthropic-ratelimit-*, X-Shopify-Shop-Api-Call-Limit) and
// Retry-After are left alone.
func StripHeaders(h http.Header) {
	for k := range h {
		if isLimitName(k) {
			delete(h, k)
		}
	}
}

// isLimitName reports whether the field name k is one StripHeaders
// removes, in any case.
func isLimitName(k string) bool {
	return strings.EqualFold(k, "RateLimit") || hasPrefixFold(k, "RateLimit-") || hasPrefixFold(k, "X-RateLimit-")
}

// draftValues returns the values of RateLimit-Policy and RateLimit for
// limits (at least one), serialized as RFC 9651 §4.1 serializes a List of
// Items with Parameters: Items separated by ", ", each a String (every
// byte printable ASCII, see sfString; `"` and `\` escaped) followed by
// ";key=value" for each parameter, an Integer's value in decimal. Built
// by hand rather than through httpsfv's List (TestDraftValuesSerialize
// holds the two to the same text): one answer goes out with these two on
// every call, and the List costs a dozen allocations a limit.
func draftValues(limits []Limit) (policy, current string) {
	var p, c []byte
	for i, l := range limits {
		if i > 0 {
			p, c = append(p, ", "...), append(c, ", "...)
		}
		name := sfString(l.Policy)
		p = appendSFString(p, name)
		p = strconv.AppendInt(append(p, ";q="...), sfInt(l.Quota), 10)
		if l.Unit != "" && l.Unit != Requests {
			p = appendSFString(append(p, ";qu="...), sfString(string(l.Unit)))
		}
		if w := ceilSeconds(l.Window); w > 0 {
			p = strconv.AppendInt(append(p, ";w="...), w, 10)
		}
		c = appendSFString(c, name)
		c = strconv.AppendInt(append(c, ";r="...), sfInt(l.Remaining), 10)
		c = strconv.AppendInt(append(c, ";t="...), ceilSeconds(l.Reset), 10)
	}
	return string(p), string(c)
}

// appendSFString appends s, all of it printable ASCII (see sfString), as
// a Structured Field String (RFC 9651 §4.1.6).
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// SetRetryAfter sets Retry-After to d in delay-seconds, rounded up, at
// least 1.
func SetRetryAfter(h http.Header, d time.Duration) {
	h.Set("Retry-After", strconv.FormatInt(max(ceilSeconds(d), 1), 10))
}

// ceilSeconds returns d in whole seconds, rounded up, never negative.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// sfInt clamps n to the range a Structured Field Integer allows, and to
// non-negative.
func sfInt(n int64) int64 {
	return min(max(n, 0), maxSFInteger)
}

// sfString returns s with every byte a Structured Field String cannot hold
// (outside printable ASCII) replaced by "_".
func sfString(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			b := []byte(s)
			for j := range b {
				if b[j] < 0x20 || b[j] > 0x7e {
					b[j] = '_'
				}
			}
			return string(b)
		}
	}
	return s
}
