package ratelimit

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Fuzz targets, one per parser. Plain go test runs their seeds (and the
// regression inputs in testdata/fuzz); go test -fuzz=^FuzzX$ explores.
// Every target checks the same properties: no panic, no negative
// duration or count, no wait above MaxRetryAfter.

// splitFixture turns a fixture's raw bytes into a header blob and a body.
func splitFixture(b []byte) (status int, headers string, body []byte) {
	f, err := parseFixture(b)
	if err != nil {
		return 200, "", nil
	}
	var sb strings.Builder
	for k, vs := range f.resp.Header {
		for _, v := range vs {
			sb.WriteString(k + ": " + v + "\n")
		}
	}
	return f.resp.Status, sb.String(), f.resp.Body
}

// headerFromBlob builds a header from "Name: value" lines without any
// validation, so that the fuzzer can put any bytes in names and values.
func headerFromBlob(blob string) http.Header {
	h := http.Header{}
	for _, line := range strings.Split(blob, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		h[http.CanonicalHeaderKey(strings.TrimSpace(k))] = append(h[http.CanonicalHeaderKey(strings.TrimSpace(k))], strings.TrimLeft(v, " "))
	}
	return h
}

func fuzzProfile(i uint8) Profile {
	ps := append(Profiles(), "", "unknown")
	return ps[int(i)%len(ps)]
}

func FuzzRead(f *testing.F) {
	paths, _ := filepath.Glob("testdata/responses/*.txt")
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		fx, err := parseFixture(b)
		if err != nil {
			f.Fatal(err)
		}
		status, headers, body := splitFixture(b)
		idx := uint8(i)
		for j, q := range Profiles() {
			if q == fx.profile {
				idx = uint8(j)
			}
		}
		f.Add(idx, status, headers, body)
	}
	f.Fuzz(func(t *testing.T, profile uint8, status int, headers string, body []byte) {
		r := read(fuzzProfile(profile), Response{Status: status, Header: headerFromBlob(headers), Body: body}, defaultNow)
		checkInvariants(t, r)
	})
}

func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"18", "0", "2.0", "-5", "1e3", "soon", "1779537630", "1779537630000",
		"1743441608", "99999999999999999999", "Sat, 23 May 2026 12:00:30 GMT",
		"Saturday, 23-May-26 12:01:00 GMT", "Sat May 23 12:02:00 2026", "Fri, 22 May 2026 12:00:00 GMT", "",
		"sat, 23 may 2026 12:00:30 gmt", "SAT, 23 MAY 2026 12:00:30 GMT", "saturday, 23-may-26 12:01:00 gmt"} {
		f.Add(s, int64(0))
	}
	f.Fuzz(func(t *testing.T, v string, offset int64) {
		ref := defaultNow.Add(time.Duration(offset))
		for _, w := range []wait{parseRetryAfter(v, ref), parseRetryAfterMS(v)} {
			if w.d < 0 || w.d > MaxRetryAfter {
				t.Errorf("wait for %q = %v, want within [0, %v]", v, w.d, MaxRetryAfter)
			}
			if !w.ok && w.d != 0 {
				t.Errorf("ignored wait for %q has duration %v", v, w.d)
			}
			if !w.ok && w.warn == "" {
				t.Errorf("wait for %q ignored without a warning", v)
			}
		}
	})
}

func FuzzDraftFields(f *testing.F) {
	f.Add(`"default";q=120;w=60`, `"default";r=117;t=42`)
	f.Add(`"burst";q=100;w=60,"daily";q=1000;w=86400`, `"daily";r=50;t=30`)
	f.Add(`"peruser";q=100;w=60;pk=:cHsdsRa894==:`, `"peruser";r=5;pk=:cHsdsRa894==:`)
	f.Add(`default;q=100;qu="content-bytes";w=10, 100;w=10`, `limit=100, remaining=50, reset=5`)
	f.Add(`"a";q=1,,`, `("a" "b");r=1, "c";r=1.5;t=-1`)
	f.Fuzz(func(t *testing.T, policy, limit string) {
		ps, legacy, _ := parsePolicies("RateLimit-Policy", strings.Split(policy, "\n"))
		ls, _, err := parseLimits("RateLimit", strings.Split(limit, "\n"))
		if len(ps) > maxMembers || len(ls) > maxMembers || len(legacy) > maxMembers {
			t.Errorf("more than %d members: %d, %d, %d", maxMembers, len(ps), len(ls), len(legacy))
		}
		for _, o := range joinDraft(ps, ls) {
			if o.Quota < 0 || o.Remaining < 0 || o.Window < 0 || o.Reset < 0 {
				t.Errorf("negative value in %+v", o)
			}
			if o.Unit == "" {
				t.Errorf("no unit in %+v", o)
			}
			sanity("RateLimit", o)
		}
		if err != nil {
			l, _, _ := parseDraft07(strings.Split(limit, "\n"))
			if l.quota < 0 || l.remaining < 0 || l.reset < 0 {
				t.Errorf("negative value in draft-07 %+v", l)
			}
		}
		for _, p := range legacy {
			if p.q < 0 || p.w < 0 {
				t.Errorf("negative legacy policy %+v", p)
			}
		}
	})
}

func FuzzOldDraft(f *testing.F) {
	f.Add("100, 100;w=60", "50", "50")
	f.Add("10, 10;w=1, 50;w=60", "9", "1779537660")
	f.Add(`100, 100;window=60;burst=1000;comment="sliding window"`, "x", "Sat, 23 May 2026 12:00:50 GMT")
	f.Fuzz(func(t *testing.T, limit, remaining, reset string) {
		q, ps, _, ok := parseLegacyLimit("RateLimit-Limit", []string{limit})
		if ok && q < 0 {
			t.Errorf("negative limit %d from %q", q, limit)
		}
		for _, p := range ps {
			if p.q < 0 || p.w <= 0 {
				t.Errorf("bad policy %+v from %q", p, limit)
			}
		}
		if n, _, ok := parseLegacyCount("RateLimit-Remaining", []string{remaining}); ok && n < 0 {
			t.Errorf("negative remaining %d from %q", n, remaining)
		}
		if d, _, _, _ := parseLegacyReset("RateLimit-Reset", []string{reset}, defaultNow); d < 0 {
			t.Errorf("negative reset %v from %q", d, reset)
		}
		for _, e := range legacyObservations(legacyLimit{quota: q, hasQuota: ok}, ps, ShapeDraft03, "") {
			if e.Quota < 0 || e.Window < 0 {
				t.Errorf("negative value in %+v", e)
			}
		}
	})
}

func FuzzValues(f *testing.F) {
	for _, s := range []string{"6m0s", "8.64s", "20ms", "1d2h", "-1s", "596.0", "32/40", "42",
		"1779537900", "1779537900000", "2026-05-23T12:01:00Z", "2026-03-26T16:00Z",
		"2026-09-27T07:08:00-05:00", "Sat, 23 May 2026 12:01:00 GMT", "-1", "1e9", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if d, ok := parseGoDuration(v); d < 0 || (!ok && d != 0) {
			t.Errorf("parseGoDuration(%q) = %v, %v", v, d, ok)
		}
		if d, _, _, _ := parseGuessedReset("X-RateLimit-Reset", v, defaultNow); d < 0 {
			t.Errorf("parseGuessedReset(%q) = %v", v, d)
		}
		if n, ok := parseCount(v); ok && n < 0 {
			t.Errorf("parseCount(%q) = %d", v, n)
		}
		if x, ok := parseDecimal(v); ok {
			if x < 0 {
				t.Errorf("parseDecimal(%q) = %v", v, x)
			}
			if d, _ := floatSeconds(x); d < 0 {
				t.Errorf("floatSeconds(%v) = %v", x, d)
			}
		}
		if used, size, ok := parseRatio(v); ok && (used < 0 || size < 0) {
			t.Errorf("parseRatio(%q) = %d, %d", v, used, size)
		}
		if tm, ok := parseTimestamp(v); ok {
			if d, _, _ := until(tm, defaultNow); d < 0 {
				t.Errorf("until(%v) = %v", tm, d)
			}
		}
		parseHTTPDate(v)
	})
}

func FuzzBody(f *testing.F) {
	f.Add(uint8(0), 429, "application/problem+json", []byte(`{"status":429,"code":"rateLimited"}`))
	f.Add(uint8(2), 200, "application/json", []byte(`{"errors":[{"type":"RATE_LIMITED"}]}`))
	f.Add(uint8(6), 200, "application/json", []byte(`{"errors":[{"extensions":{"code":"THROTTLED"}}],"extensions":{"cost":{"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":40,"restoreRate":50.0}}}}`))
	f.Add(uint8(5), 429, "application/json", []byte(`{"retry_after":1336.57,"global":false}`))
	f.Add(uint8(2), 403, "application/json", []byte(`{"message":"You have exceeded a secondary rate limit.","documentation_url":"x#abuse-rate-limits"}`))
	f.Add(uint8(0), 429, "application/problem+json", []byte(`{"type":"https://iana.org/assignments/http-problem-types#abnormal-usage-detected","violated-policies":["a",1]}`))
	f.Add(uint8(10), 429, "application/json", []byte(`{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"PerMinute","quotaValue":"15"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"35s"}]}}`))
	f.Add(uint8(3), 429, "application/json", []byte(`[{"error":{"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-1.5s"}]}}]`))
	f.Add(uint8(3), 429, "application/json", []byte(`{"error":{"message":"Please try again in 634ms.","code":"rate_limit_exceeded"}}`))
	f.Add(uint8(13), 200, "application/json", []byte(`{"ok":false,"error":"ratelimited"}`))
	f.Add(uint8(14), 429, "application/json", []byte(`{"error":{"code":"lock_timeout"}}`))
	f.Fuzz(func(t *testing.T, profile uint8, status int, contentType string, body []byte) {
		h := http.Header{"Content-Type": {contentType}, "Ratelimit": {`"a";r=5;t=3`}}
		r := read(fuzzProfile(profile), Response{Status: status, Header: h, Body: body}, defaultNow)
		checkInvariants(t, r)
		if r.Problem != nil && r.Problem.Status != 0 && (r.Problem.Status < 100 || r.Problem.Status > 999) {
			t.Errorf("problem status %d", r.Problem.Status)
		}
	})
}

// FuzzSetHeaders checks that whatever SetHeaders writes is well-formed:
// Read parses it back, under the ietf profile, into one observation per
// limit, with no malformed-field warning.
func FuzzSetHeaders(f *testing.F) {
	f.Add("default", "", int64(120), int64(60e9), int64(117), int64(42e9))
	f.Add("tokens", "tokens", int64(-1), int64(-1), int64(1<<62), int64(1<<62))
	f.Add("f\u00fc\u00fc\"\\", "content-bytes", int64(0), int64(1), int64(0), int64(1))
	f.Fuzz(func(t *testing.T, policy, unit string, q, w, r, reset int64) {
		h := http.Header{}
		limits := []Limit{{Policy: policy, Unit: Unit(unit), Quota: q, Window: time.Duration(w),
			Remaining: r, Reset: time.Duration(reset)}}
		SetHeaders(h, limits)
		if wantP, wantC := sfvDraft(t, limits); h.Get("RateLimit-Policy") != wantP || h.Get("RateLimit") != wantC {
			t.Errorf("SetHeaders wrote %q, %q; httpsfv writes %q, %q", h.Get("RateLimit-Policy"), h.Get("RateLimit"), wantP, wantC)
		}
		got := read(IETF, Response{Status: 200, Header: h}, defaultNow)
		if len(got.Observations) != 1 {
			t.Fatalf("read back %d observations from %v, want 1 (warnings %q)", len(got.Observations), h, got.Warnings)
		}
		for _, warn := range got.Warnings {
			if strings.Contains(warn, "malformed") || strings.Contains(warn, "ignored") {
				t.Errorf("SetHeaders wrote %v; Read warns %q", h, warn)
			}
		}
		if o := got.Observations[0]; o.Remaining != sfInt(r) || o.Quota != sfInt(q) {
			t.Errorf("read back q=%d r=%d, want %d %d", o.Quota, o.Remaining, sfInt(q), sfInt(r))
		}
		var ra bytes.Buffer
		SetRetryAfter(h, time.Duration(reset))
		ra.WriteString(h.Get("Retry-After"))
		if n, ok := parseCount(ra.String()); !ok || n < 1 {
			t.Errorf("SetRetryAfter(%v) wrote %q", time.Duration(reset), ra.String())
		}
	})
}
