package ratelimit

import (
	"testing"
	"time"
)

// Fuzz targets for the parsers of the second round of signals: prose
// hints, protobuf durations, lenient HTTP-dates and the fields of the
// x, kong and anthropic unified profiles. Their seeds run in plain go
// test.

func FuzzProseWait(f *testing.F) {
	for _, s := range []string{"Please try again in 634ms.", "Please retry after 33 seconds.", "Please retry in 35.60207746s.",
		"try again in 1m30s", "try again in 20 s", "retry after 2 minutes", "try again in -5s", "try again in 1e309s",
		"retry in 9999999999 hours", "Try Again In 2.196S", "try again in ", "retry after soon", "try again in 1.2.3s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, phrase, ok := parseProseWait(s)
		if d < 0 || d > MaxRetryAfter {
			t.Errorf("parseProseWait(%q) = %v, want within [0, %v]", s, d, MaxRetryAfter)
		}
		if ok && phrase == "" || !ok && (d != 0 || phrase != "") {
			t.Errorf("parseProseWait(%q) = %v, %q, %v", s, d, phrase, ok)
		}
	})
}

func FuzzProtoDuration(f *testing.F) {
	for _, s := range []string{"35s", "35.602077s", "0s", "-1s", "1e3s", "s", "35", "86401s", "3.000000001s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w := parseProtoDuration(s)
		if w.d < 0 || w.d > MaxRetryAfter || !w.ok && w.warn == "" {
			t.Errorf("parseProtoDuration(%q) = %+v", s, w)
		}
	})
}

func FuzzHTTPDateLenient(f *testing.F) {
	for _, s := range []string{"mon, 01 jun 2026 12:01:00 gmt", "Mon, 01 Jun 2026 12:01:00 GMT", "sunday, 06-nov-94 08:49:37 gmt",
		"sun nov  6 08:49:37 1994", "MON, 01 JUN 2026 12:01:00 GMT", "mon, 01 jun 2026 12:01:00 utc", "ñ", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tm, lenient, ok := parseHTTPDateLenient(s)
		strict, okStrict := parseHTTPDate(s)
		if okStrict && (!ok || !tm.Equal(strict)) {
			t.Errorf("parseHTTPDateLenient(%q) = %v, %v; the strict parse reads %v", s, tm, ok, strict)
		}
		if !ok && lenient {
			t.Errorf("parseHTTPDateLenient(%q): lenient without a date", s)
		}
		if c := canonicalDateCase(s); len(c) != len(s) {
			t.Errorf("canonicalDateCase(%q) = %q changed the length", s, c)
		}
	})
}

// FuzzVendorFields reads arbitrary values in the fields of the x, kong,
// anthropic (unified) and jira (X-Beta-RateLimit-Reset) profiles.
func FuzzVendorFields(f *testing.F) {
	for _, s := range []string{"0", "75", "1779538320", "-1", "0.42", "1.0", "rejected", "allowed", "2026-03-26T16:00Z", "x", ""} {
		f.Add(s, 429)
	}
	f.Fuzz(func(t *testing.T, v string, status int) {
		for _, c := range []struct {
			p     Profile
			names []string
		}{
			{X, []string{"X-Rate-Limit-Limit", "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset", "X-User-Limit-24hour-Remaining", "X-App-Limit-24hour-Reset"}},
			{Kong, []string{"X-Ratelimit-Limit-Minute", "X-Ratelimit-Remaining-Minute", "X-Ratelimit-Remaining-Month", "X-Ratelimit-Limit-Year"}},
			{Anthropic, []string{"Anthropic-Ratelimit-Unified-5h-Utilization", "Anthropic-Ratelimit-Unified-5h-Reset", "Anthropic-Ratelimit-Unified-Status", "Anthropic-Ratelimit-Unified-Reset"}},
			{Jira, []string{"X-Beta-Ratelimit-Reset", "Beta-Ratelimit"}},
			{Stripe, []string{"Stripe-Rate-Limited-Reason", "Stripe-Should-Retry"}},
		} {
			h := map[string][]string{"Date": {"Sat, 23 May 2026 12:00:00 GMT"}}
			for _, n := range c.names {
				h[n] = []string{v}
			}
			r := read(c.p, Response{Status: status, Header: h}, defaultNow.Add(time.Duration(len(v))*time.Second))
			checkInvariants(t, r)
		}
	})
}
