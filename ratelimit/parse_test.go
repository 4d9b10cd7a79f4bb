package ratelimit

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseProfile(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    Profile
		wantErr bool
	}{
		{"", Generic, false},
		{"  ", Generic, false},
		{"generic", Generic, false},
		{"IETF", IETF, false},
		{" github ", GitHub, false},
		{"openai", OpenAI, false},
		{"anthropic", Anthropic, false},
		{"discord", Discord, false},
		{"shopify", Shopify, false},
		{"gitlab", GitLab, false},
		{"reddit", Reddit, false},
		{"jira", Jira, false},
		{"twitter", "", true},
		{"git hub", "", true},
	} {
		got, err := ParseProfile(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ParseProfile(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "generic, ietf, github") {
			t.Errorf("ParseProfile(%q) error %q does not list the valid names", tt.in, err)
		}
	}
	for _, p := range Profiles() {
		if !p.Valid() {
			t.Errorf("%q.Valid() = false", p)
		}
	}
	if !Profile("").Valid() || Profile("nope").Valid() {
		t.Error("Valid: the zero value is valid, an unknown name is not")
	}
}

func TestParseRetryAfter(t *testing.T) {
	ref := defaultNow
	for _, tt := range []struct {
		in       string
		want     time.Duration
		wantOK   bool
		wantWarn bool
	}{
		{"18", 18 * time.Second, true, false},
		{" 18 ", 18 * time.Second, true, false},
		{"0", 0, true, false},
		{"86400", MaxRetryAfter, true, false},
		{"86401", MaxRetryAfter, true, true},
		{"2.0", 2 * time.Second, true, true},
		{"0.001", time.Second, true, true},
		{".5", 0, false, true},
		{"5.", 0, false, true},
		{"-5", 0, false, true},
		{"-0", 0, false, true},
		{"+5", 0, false, true},
		{"1e3", 0, false, true},
		{"NaN", 0, false, true},
		{"Inf", 0, false, true},
		{"0x10", 0, false, true},
		{"", 0, false, true},
		{"5, 10", 0, false, true},
		{"Sat, 23 May 2026 12:00:30 GMT", 30 * time.Second, true, false},
		{"Saturday, 23-May-26 12:00:30 GMT", 30 * time.Second, true, false},
		{"Sat May 23 12:00:30 2026", 30 * time.Second, true, false},
		{"Sat, 23 May 2026 12:00:30 UTC", 0, false, true},
		{"2026-05-23T12:00:30Z", 0, false, true},
		{"Fri, 22 May 2026 12:00:00 GMT", 0, true, true},
		{"1779537630", 30 * time.Second, true, true},
		{"1779537630000", 30 * time.Second, true, true},
		{"1779537500", 0, true, true},                   // an epoch 100 s in the past
		{"1779537600000000", MaxRetryAfter, true, true}, // microseconds: no plausible reading
		{"1743441608", MaxRetryAfter, true, true},
		{"99999999999999999999999999", MaxRetryAfter, true, true},
		{strings.Repeat("9", 100), 0, false, true},
	} {
		w := parseRetryAfter(tt.in, ref)
		if w.d != tt.want || w.ok != tt.wantOK || (w.warn != "") != tt.wantWarn {
			t.Errorf("parseRetryAfter(%q) = %v, ok %v, warn %q; want %v, ok %v, warn %v",
				tt.in, w.d, w.ok, w.warn, tt.want, tt.wantOK, tt.wantWarn)
		}
	}
}

func TestParseGoDuration(t *testing.T) {
	for _, tt := range []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"1s", time.Second, true},
		{"6m0s", 6 * time.Minute, true},
		{"8.64s", 8640 * time.Millisecond, true},
		{"20ms", 20 * time.Millisecond, true},
		{"1m12s", 72 * time.Second, true},
		{"1d", 24 * time.Hour, true},
		{"2d3h", 51 * time.Hour, true},
		{"0", 0, true},
		{"0s", 0, true},
		{"", 0, false},
		{"d", 0, false},
		{"1.5d", 0, false},
		{"-1s", 0, false},
		{"60", 0, false},
		{"1x", 0, false},
		{"99999999999d", 0, false},
	} {
		got, ok := parseGoDuration(tt.in)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("parseGoDuration(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestParseGuessedReset(t *testing.T) {
	for _, tt := range []struct {
		in          string
		want        time.Duration
		wantGuessed bool
		wantOK      bool
	}{
		{"42", 42 * time.Second, true, true},
		{"42.1", 43 * time.Second, true, true},
		{"999999999", 999999999 * time.Second, true, true},
		{"1779537900", 5 * time.Minute, true, true},
		{"1779537900000", 5 * time.Minute, true, true},
		{"1779537000", 0, true, true},         // epoch in the past
		{"1372700873", 0, false, false},       // implausible epoch
		{"500000000000", 0, false, false},     // between the bands
		{"1779537900000000", 0, false, false}, // microseconds
		{"Sat, 23 May 2026 12:01:00 GMT", time.Minute, false, true},
		{"2026-05-23T12:01:00Z", time.Minute, false, true},
		{"2026-05-23T12:01Z", time.Minute, false, true},
		{"-1", 0, false, false},
		{"soon", 0, false, false},
	} {
		got, guessed, _, ok := parseGuessedReset("X-RateLimit-Reset", tt.in, defaultNow)
		if got != tt.want || guessed != tt.wantGuessed || ok != tt.wantOK {
			t.Errorf("parseGuessedReset(%q) = %v, guessed %v, ok %v; want %v, %v, %v",
				tt.in, got, guessed, ok, tt.want, tt.wantGuessed, tt.wantOK)
		}
	}
}

// TestStructuredFieldRejections places the must-fail inputs of
// httpwg/structured-field-tests (list.json, param-list.json, number.json,
// string.json, binary.json, key-generated.json) in RateLimit and
// RateLimit-Policy: each field must be ignored as a whole, with a warning,
// and never half-applied.
func TestStructuredFieldRejections(t *testing.T) {
	for _, tt := range []struct {
		name string
		raw  []string
	}{
		{"trailing comma list", []string{`"a";r=1, "b";r=2,`}},
		{"empty item list", []string{`"a";r=1,,"b";r=2`}},
		{"empty field line among several", []string{`"a";r=1`, ``, `"b";r=2`}},
		{"whitespace before = parameterised list", []string{`"a";r =1`}},
		{"whitespace after = parameterised list", []string{`"a";r= 1`}},
		{"whitespace before ; parameterised list", []string{`"a" ;r=1`}},
		{"trailing comma parameterised list", []string{`"a";r=1,"b";r=2,`}},
		{"empty item parameterised list", []string{`"a";r=1,,"b";r=2,`}},
		{"too long integer", []string{`"a";r=1234567890123456`}},
		{"negative too long integer", []string{`"a";r=-1234567890123456`}},
		{"decimal with too many fractional digits", []string{`"a";r=1.1234`}},
		{"decimal with trailing dot", []string{`"a";r=1.`}},
		{"double decimal", []string{`"a";r=1.5.4`}},
		{"uppercase key", []string{`"a";R=1`}},
		{"key starting with a digit", []string{`"a";1a=1`}},
		{"empty key", []string{`"a";=1`}},
		{"trailing semicolon", []string{`"a";r=1;`}},
		{"non-ASCII string", []string{"\"f\u00fc\u00fc\";r=1"}},
		{"tab in string", []string{"\"a\tb\";r=1"}},
		{"bad escape", []string{`"a\x";r=1`}},
		{"unterminated string", []string{`"abc;r=1`}},
		{"whitespace in byte sequence", []string{`"a";r=1;pk=:cHsd sRa8:`}},
		{"misplaced = in byte sequence", []string{`"a";r=1;pk=:cH=sdsRa8:`}},
		{"unterminated byte sequence", []string{`"a";r=1;pk=:cHsd`}},
		{"token starting with a digit", []string{`1a;r=1`}},
		{"item then garbage", []string{`"a";r=1 "b"`}},
	} {
		for _, field := range []string{"RateLimit", "RateLimit-Policy"} {
			raw := make([]string, len(tt.raw))
			for i, v := range tt.raw {
				raw[i] = strings.ReplaceAll(v, ";r=", map[string]string{"RateLimit": ";r=", "RateLimit-Policy": ";q="}[field])
			}
			h := http.Header{http.CanonicalHeaderKey(field): raw}
			r := Read(Generic, Response{Status: 200, Header: h}, defaultNow)
			if len(r.Observations) != 0 {
				t.Errorf("%s in %s: got observations %+v, want none", tt.name, field, r.Observations)
			}
			if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], field+":") {
				t.Errorf("%s in %s: warnings %q, want one about %s", tt.name, field, r.Warnings, field)
			}
		}
	}
}

func TestReadRobustness(t *testing.T) {
	t.Run("nil header", func(t *testing.T) {
		r := Read(Generic, Response{Status: 429}, defaultNow)
		if !r.Throttled || len(r.Warnings) != 0 || len(r.Observations) != 0 {
			t.Errorf("Read(429, nil header) = %+v", r)
		}
	})
	t.Run("hand-built lower-case keys", func(t *testing.T) {
		// Keys as a hand-built map might spell them, not canonical.
		rl, ra := strings.ToLower("RateLimit"), strings.ToLower("Retry-After")
		h := http.Header{rl: {`"default";r=5;t=3`}, ra: {"7"}}
		r := Read(Generic, Response{Status: 429, Header: h}, defaultNow)
		if len(r.Observations) != 1 || r.RetryAfter != 7*time.Second {
			t.Errorf("Read with lower-case keys = %+v", r)
		}
		if _, ok := h[rl]; !ok {
			t.Error("Read modified the caller's header map")
		}
	})
	t.Run("unknown profile reads as generic", func(t *testing.T) {
		h := http.Header{"X-Ratelimit-Remaining": {"5"}}
		r := Read(Profile("nope"), Response{Status: 200, Header: h}, defaultNow)
		if len(r.Observations) != 1 || r.Observations[0].Profile != Generic || len(r.Warnings) != 1 {
			t.Errorf("Read(nope) = %+v", r)
		}
	})
	t.Run("zero profile is generic", func(t *testing.T) {
		h := http.Header{"X-Ratelimit-Remaining": {"5"}}
		r := Read("", Response{Status: 200, Header: h}, defaultNow)
		if len(r.Observations) != 1 || r.Observations[0].Profile != Generic {
			t.Errorf("Read(\"\") = %+v", r)
		}
	})
	t.Run("body beyond MaxBody is not read", func(t *testing.T) {
		body := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","pad":"` +
			strings.Repeat("x", MaxBody) + `"}`
		h := http.Header{"Content-Type": {"application/problem+json"}}
		r := Read(Generic, Response{Status: 400, Header: h, Body: []byte(body)}, defaultNow)
		if r.Problem != nil || r.Throttled || len(r.Warnings) != 1 {
			t.Errorf("Read(huge body) = problem %+v, throttled %v, warnings %q", r.Problem, r.Throttled, r.Warnings)
		}
	})
	t.Run("warnings are bounded", func(t *testing.T) {
		h := http.Header{}
		for i := 0; i < 100; i++ {
			h.Add("Retry-After", "garbage")
		}
		r := Read(Generic, Response{Status: 429, Header: h}, defaultNow)
		if len(r.Warnings) != maxWarnings+1 || r.Warnings[maxWarnings] != "further warnings omitted" {
			t.Errorf("got %d warnings, want %d ending with the omission note", len(r.Warnings), maxWarnings+1)
		}
	})
	t.Run("read is pure", func(t *testing.T) {
		h := http.Header{"Ratelimit": {`"default";r=5;t=3`}, "Date": {"Sat, 23 May 2026 12:00:00 GMT"}}
		resp := Response{Status: 200, Header: h}
		a, b := Read(IETF, resp, defaultNow), Read(IETF, resp, defaultNow)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Errorf("two Reads differ:\n%s", diff)
		}
	})
}
