package ratelimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/google/go-cmp/cmp"
)

func TestSetHeaders(t *testing.T) {
	tests := []struct {
		name   string
		before http.Header
		limits []Limit
		want   http.Header
	}{
		{
			name:   "seed",
			limits: []Limit{{Policy: "default", Quota: 120, Window: time.Minute, Remaining: 117, Reset: 42 * time.Second}},
			want: http.Header{
				"Ratelimit-Policy":      {`"default";q=120;w=60`},
				"Ratelimit":             {`"default";r=117;t=42`},
				"X-Ratelimit-Limit":     {"120"},
				"X-Ratelimit-Remaining": {"117"},
				"X-Ratelimit-Reset":     {"42"},
			},
		},
		{
			name: "tightest is the lowest remaining, ties to the longest reset",
			limits: []Limit{
				{Policy: "minute", Quota: 120, Window: time.Minute, Remaining: 5, Reset: 10 * time.Second},
				{Policy: "hour", Quota: 1000, Window: time.Hour, Remaining: 5, Reset: 30 * time.Minute},
				{Policy: "day", Quota: 5000, Window: 24 * time.Hour, Remaining: 900, Reset: 2 * time.Hour},
			},
			want: http.Header{
				"Ratelimit-Policy":      {`"minute";q=120;w=60, "hour";q=1000;w=3600, "day";q=5000;w=86400`},
				"Ratelimit":             {`"minute";r=5;t=10, "hour";r=5;t=1800, "day";r=900;t=7200`},
				"X-Ratelimit-Limit":     {"1000"},
				"X-Ratelimit-Remaining": {"5"},
				"X-Ratelimit-Reset":     {"1800"},
			},
		},
		{
			name: "X- fields describe a request-counting limit when there is one; qu only for other units",
			limits: []Limit{
				{Policy: "tokens", Unit: Tokens, Quota: 30000, Window: time.Minute, Remaining: 0, Reset: time.Second},
				{Policy: "requests", Unit: Requests, Quota: 500, Window: time.Minute, Remaining: 400, Reset: time.Second},
			},
			want: http.Header{
				"Ratelimit-Policy":      {`"tokens";q=30000;qu="tokens";w=60, "requests";q=500;w=60`},
				"Ratelimit":             {`"tokens";r=0;t=1, "requests";r=400;t=1`},
				"X-Ratelimit-Limit":     {"500"},
				"X-Ratelimit-Remaining": {"400"},
				"X-Ratelimit-Reset":     {"1"},
			},
		},
		{
			name:   "no request-counting limit: no X- fields",
			limits: []Limit{{Policy: "tokens", Unit: Tokens, Quota: 30000, Window: time.Minute, Remaining: 0, Reset: time.Second}},
			want: http.Header{
				"Ratelimit-Policy": {`"tokens";q=30000;qu="tokens";w=60`},
				"Ratelimit":        {`"tokens";r=0;t=1`},
			},
		},
		{
			name: "durations round up, negatives become 0, no window means no w",
			limits: []Limit{
				{Policy: "p", Quota: -3, Remaining: -1, Reset: 1500 * time.Millisecond},
			},
			want: http.Header{
				"Ratelimit-Policy":      {`"p";q=0`},
				"Ratelimit":             {`"p";r=0;t=2`},
				"X-Ratelimit-Limit":     {"0"},
				"X-Ratelimit-Remaining": {"0"},
				"X-Ratelimit-Reset":     {"2"},
			},
		},
		{
			name:   "a name that is no valid String is made one",
			limits: []Limit{{Policy: "füü\n", Quota: 1, Window: time.Second, Remaining: 1, Reset: -time.Second}},
			want: http.Header{
				"Ratelimit-Policy":      {`"f_____";q=1;w=1`},
				"Ratelimit":             {`"f_____";r=1;t=0`},
				"X-Ratelimit-Limit":     {"1"},
				"X-Ratelimit-Remaining": {"1"},
				"X-Ratelimit-Reset":     {"0"},
			},
		},
		{
			name: "upstream rate-limit fields are replaced; other vendor fields stay",
			before: http.Header{
				"Ratelimit":                     {`"upstream";r=999`},
				"Ratelimit-Limit":               {"1000"},
				"Ratelimit-Reset":               {"1"},
				"Ratelimit-Name":                {"throttle_authenticated_api"},
				"X-Ratelimit-Reset-After":       {"1"},
				"X-Ratelimit-Limit-Requests":    {"5000"},
				"Beta-Ratelimit":                {`"tenant";r=1`},
				"X-Shopify-Shop-Api-Call-Limit": {"1/40"},
				"Retry-After":                   {"5"},
				"Content-Type":                  {"application/json"},
			},
			limits: []Limit{{Policy: "default", Quota: 120, Window: time.Minute, Remaining: 1, Reset: time.Minute}},
			want: http.Header{
				"Beta-Ratelimit":                {`"tenant";r=1`},
				"X-Shopify-Shop-Api-Call-Limit": {"1/40"},
				"Retry-After":                   {"5"},
				"Content-Type":                  {"application/json"},
				"Ratelimit-Policy":              {`"default";q=120;w=60`},
				"Ratelimit":                     {`"default";r=1;t=60`},
				"X-Ratelimit-Limit":             {"120"},
				"X-Ratelimit-Remaining":         {"1"},
				"X-Ratelimit-Reset":             {"60"},
			},
		},
		{
			name:   "no limits only removes",
			before: http.Header{"Ratelimit": {`"a";r=1`}, "x-ratelimit-remaining": {"5"}, "Etag": {`"x"`}},
			want:   http.Header{"Etag": {`"x"`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.before.Clone()
			if h == nil {
				h = http.Header{}
			}
			SetHeaders(h, tt.limits)
			if diff := cmp.Diff(tt.want, h); diff != "" {
				t.Errorf("SetHeaders mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSetHeadersRoundTrip checks that what SetHeaders writes, Read reads
// back as the same policies under the ietf profile, without warnings.
func TestSetHeadersRoundTrip(t *testing.T) {
	limits := []Limit{
		{Policy: "minute", Quota: 120, Window: time.Minute, Remaining: 7, Reset: 42 * time.Second},
		{Policy: "bytes", Unit: ContentBytes, Quota: 65535, Window: 10 * time.Second, Remaining: 1000, Reset: 3 * time.Second},
	}
	h := http.Header{}
	SetHeaders(h, limits)
	r := Read(IETF, Response{Status: 200, Header: h}, defaultNow)
	if len(r.Warnings) != 0 {
		t.Errorf("Read warnings = %q, want none", r.Warnings)
	}
	want := []Observation{
		{Policy: "minute", Unit: Requests, Quota: 120, HasQuota: true, Window: time.Minute,
			Remaining: 7, HasRemaining: true, Reset: 42 * time.Second, HasReset: true, Shape: ShapeDraft},
		{Policy: "bytes", Unit: ContentBytes, Quota: 65535, HasQuota: true, Window: 10 * time.Second,
			Remaining: 1000, HasRemaining: true, Reset: 3 * time.Second, HasReset: true, Shape: ShapeDraft},
	}
	if diff := cmp.Diff(want, r.Observations); diff != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", diff)
	}
}

func TestSetRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{18 * time.Second, "18"},
		{1500 * time.Millisecond, "2"},
		{time.Millisecond, "1"},
		{0, "1"},
		{-time.Hour, "1"},
		{25 * time.Hour, "90000"},
	} {
		h := http.Header{"Retry-After": {"0", "3"}}
		SetRetryAfter(h, tt.d)
		if got := h.Values("Retry-After"); len(got) != 1 || got[0] != tt.want {
			t.Errorf("SetRetryAfter(%v) = %q, want [%q]", tt.d, got, tt.want)
		}
	}
}

func TestStripHeaders(t *testing.T) {
	h := http.Header{
		"Ratelimit":               {"x"},
		"Ratelimit-Policy":        {"x"},
		"Ratelimit-Reason":        {"jira-burst-based"},
		"X-Ratelimit-Bucket":      {"abcd"},
		"x-ratelimit-limit":       {"5"}, // a hand-built, non-canonical key
		"Ratelimits":              {"keep: not a rate-limit field name"},
		"X-Rate-Limit-Limit":      {"keep: another vendor's name"},
		"Anthropic-Ratelimit-Foo": {"keep"},
	}
	StripHeaders(h)
	want := http.Header{
		"Ratelimits":              {"keep: not a rate-limit field name"},
		"X-Rate-Limit-Limit":      {"keep: another vendor's name"},
		"Anthropic-Ratelimit-Foo": {"keep"},
	}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("StripHeaders mismatch (-want +got):\n%s", diff)
	}
}

// sfvDraft is RateLimit-Policy and RateLimit for limits as httpsfv
// serializes them: what draftValues must write.
func sfvDraft(t testing.TB, limits []Limit) (policy, current string) {
	t.Helper()
	var ps, cs httpsfv.List
	for _, l := range limits {
		p := httpsfv.NewItem(sfString(l.Policy))
		p.Params.Add("q", sfInt(l.Quota))
		if l.Unit != "" && l.Unit != Requests {
			p.Params.Add("qu", sfString(string(l.Unit)))
		}
		if w := ceilSeconds(l.Window); w > 0 {
			p.Params.Add("w", w)
		}
		ps = append(ps, p)
		c := httpsfv.NewItem(sfString(l.Policy))
		c.Params.Add("r", sfInt(l.Remaining))
		c.Params.Add("t", ceilSeconds(l.Reset))
		cs = append(cs, c)
	}
	policy, err := httpsfv.Marshal(ps)
	if err != nil {
		t.Fatal(err)
	}
	current, err = httpsfv.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	return policy, current
}

func TestDraftValuesSerialize(t *testing.T) {
	for _, limits := range [][]Limit{
		{{Policy: "default", Quota: 120, Window: time.Minute, Remaining: 117, Reset: 42 * time.Second}},
		{{Policy: `a "quoted" \ name`, Unit: Tokens, Quota: 1 << 62, Window: -1, Remaining: -5, Reset: 1}},
		{{Policy: "f\u00fc\u00fc\t\x7f", Unit: "unit \"x\"\\", Quota: 0, Window: 1500 * time.Millisecond}},
		{{Policy: ""}, {Policy: "hour", Quota: 1000, Window: time.Hour, Remaining: 5, Reset: 30 * time.Minute},
			{Policy: "day", Unit: ContentBytes, Quota: 5000, Window: 24 * time.Hour, Remaining: 900, Reset: 2 * time.Hour}},
	} {
		gotP, gotC := draftValues(limits)
		wantP, wantC := sfvDraft(t, limits)
		if gotP != wantP || gotC != wantC {
			t.Errorf("draftValues(%v) = %q, %q; httpsfv writes %q, %q", limits, gotP, gotC, wantP, wantC)
		}
	}
}

// TestWriteFieldsAllocations holds what stating the shared budget on an
// answer allocates, as the REST side does on every call: the seed's
// fields in, one policy out.
func TestWriteFieldsAllocations(t *testing.T) {
	allocs := testing.AllocsPerRun(100, stateOnSeedAnswer)
	// The header map the function is given (its table and six values)
	// is built in the loop too; WriteFields itself allocates its two
	// values and their byte slices, the three X- values and their
	// slices, and its copy of the limits: 23 in all (69 when the draft
	// fields went through httpsfv's List), a few more under the race
	// detector.
	if allocs > 35 {
		t.Errorf("WriteFields allocates %v times a call, want at most 35", allocs)
	}
}

// stateOnSeedAnswer states the reference API's one policy on an answer
// carrying the seed's fields, as the REST side does on every call; the
// header map it is given is built here too.
func stateOnSeedAnswer() {
	limits := []Limit{{Policy: "default", Quota: 120, Window: time.Minute, Remaining: 117, Reset: 42 * time.Second}}
	h := http.Header{
		"Ratelimit-Policy":      {`"default";q=120;w=60`},
		"Ratelimit":             {`"default";r=117;t=42`},
		"X-Ratelimit-Limit":     {"120"},
		"X-Ratelimit-Remaining": {"117"},
		"X-Ratelimit-Reset":     {"42"},
		"Content-Type":          {"application/json"},
	}
	WriteFields(h, Announcement{Profile: Generic, Limits: limits})
}
