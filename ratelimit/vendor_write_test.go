package ratelimit

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// WriteFields on each profile: the upstream's own fields pass, made no
// more generous than the shared budget; mcp-quota's own answers get the
// vendor's fields written from it; a wait says nothing is left until it
// ends.
func TestWriteFields(t *testing.T) {
	now := time.Date(2026, 12, 1, 20, 0, 0, 500e6, time.UTC) // half past a second
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	core := Limit{Policy: "core", Quota: 30, Window: time.Minute, Remaining: 10, Reset: 40 * time.Second}
	for _, tt := range []struct {
		name     string
		upstream map[string]string // the answer's fields; nil for mcp-quota's own answer
		a        Announcement
		want     map[string]string // "" means absent
	}{
		{
			name: "github: the upstream's more generous remaining is lowered, its reset moved later",
			upstream: map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "25", "X-RateLimit-Reset": epoch(20 * time.Second),
				"X-RateLimit-Used": "5", "X-RateLimit-Resource": "core"},
			a: Announcement{Profile: GitHub, Limits: []Limit{core}},
			want: map[string]string{"X-Ratelimit-Limit": "30", "X-Ratelimit-Remaining": "10", "X-Ratelimit-Reset": epoch(41 * time.Second),
				"X-Ratelimit-Used": "20", "X-Ratelimit-Resource": "core",
				"Ratelimit-Policy": `"core";q=30;w=60`, "Ratelimit": `"core";r=10;t=40`},
		},
		{
			name: "github: the upstream's tighter fields pass as they came",
			upstream: map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset": epoch(20 * time.Second),
				"X-RateLimit-Used": "26", "X-RateLimit-Resource": "core"},
			a:    Announcement{Profile: GitHub, Limits: []Limit{core}},
			want: map[string]string{"X-Ratelimit-Remaining": "4", "X-Ratelimit-Reset": epoch(20 * time.Second), "X-Ratelimit-Used": "26"},
		},
		{
			name: "github: a pacing refusal by mcp-quota says 0 until Retry-After, in epoch seconds rounded up",
			a:    Announcement{Profile: GitHub, Limits: []Limit{core}, Wait: 15 * time.Second},
			want: map[string]string{"X-Ratelimit-Limit": "30", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Used": "30",
				"X-Ratelimit-Reset": epoch(16 * time.Second), "Ratelimit": `"core";r=0;t=15`},
		},
		{
			name:     "github: a secondary refusal passes as the upstream sent it",
			upstream: map[string]string{"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "29", "X-RateLimit-Reset": epoch(6 * time.Second)},
			a:        Announcement{Profile: GitHub, Limits: []Limit{core}, Wait: 5 * time.Second, Secondary: true},
			want:     map[string]string{"X-Ratelimit-Remaining": "29", "X-Ratelimit-Reset": epoch(6 * time.Second), "Ratelimit": `"core";r=0;t=5`},
		},
		{
			name: "github: a probe's refusal with no known budget still says 0 until the wait",
			a:    Announcement{Profile: GitHub, Wait: time.Second},
			want: map[string]string{"X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": epoch(2 * time.Second), "X-Ratelimit-Limit": ""},
		},
		{
			name: "openai: six fields as Go durations, tokens listed in RateLimit too",
			upstream: map[string]string{"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "1s",
				"x-ratelimit-limit-tokens": "10000", "x-ratelimit-remaining-tokens": "9000", "x-ratelimit-reset-tokens": "6m0s"},
			a: Announcement{Profile: OpenAI, Limits: []Limit{
				{Policy: "requests", Quota: 60, Window: time.Minute, Remaining: 3, Reset: 8640 * time.Millisecond},
				{Policy: "tokens", Unit: Tokens, Quota: 10000, Remaining: 9000, Reset: 6 * time.Minute}}},
			want: map[string]string{"X-Ratelimit-Limit-Requests": "60", "X-Ratelimit-Remaining-Requests": "3", "X-Ratelimit-Reset-Requests": "8.64s",
				"X-Ratelimit-Limit-Tokens": "10000", "X-Ratelimit-Remaining-Tokens": "9000", "X-Ratelimit-Reset-Tokens": "6m0s",
				"Ratelimit": `"requests";r=3;t=9, "tokens";r=9000;t=360`, "X-Ratelimit-Limit": ""},
		},
		{
			name: "openai: mcp-quota's refusal writes the six from the budget",
			a: Announcement{Profile: OpenAI, Wait: 8 * time.Second, Limits: []Limit{
				{Policy: "requests", Quota: 60, Remaining: 2, Reset: 23 * time.Second},
				{Policy: "tokens", Unit: Tokens, Quota: 10000, Remaining: 0, Reset: 30 * time.Second}}},
			want: map[string]string{"X-Ratelimit-Remaining-Requests": "0", "X-Ratelimit-Reset-Requests": "8s",
				"X-Ratelimit-Remaining-Tokens": "0", "X-Ratelimit-Reset-Tokens": "30s", "Ratelimit": `"requests";r=0;t=8, "tokens";r=0;t=30`},
		},
		{
			name:     "anthropic: RFC 3339 resets",
			upstream: map[string]string{"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49", "anthropic-ratelimit-requests-reset": "2026-12-01T20:00:01Z"},
			a:        Announcement{Profile: Anthropic, Limits: []Limit{{Policy: "requests", Quota: 50, Remaining: 7, Reset: 30 * time.Second}}},
			want:     map[string]string{"Anthropic-Ratelimit-Requests-Remaining": "7", "Anthropic-Ratelimit-Requests-Reset": "2026-12-01T20:00:31Z"},
		},
		{
			name:     "gitlab: epoch reset, its HTTP-date and the observed count",
			upstream: map[string]string{"RateLimit-Limit": "600", "RateLimit-Remaining": "590", "RateLimit-Observed": "10", "RateLimit-Reset": epoch(10 * time.Second), "RateLimit-Name": "throttle_authenticated_api"},
			a:        Announcement{Profile: GitLab, Limits: []Limit{{Policy: "throttle_authenticated_api", Quota: 600, Remaining: 100, Reset: 50 * time.Second}}},
			want: map[string]string{"Ratelimit-Remaining": "100", "Ratelimit-Observed": "500", "Ratelimit-Reset": epoch(51 * time.Second),
				"Ratelimit-Resettime": now.Add(51 * time.Second).Truncate(time.Second).Format(http.TimeFormat), "Ratelimit-Name": "throttle_authenticated_api"},
		},
		{
			name:     "discord: fractional epoch and reset-after",
			upstream: map[string]string{"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Reset": strconv.FormatFloat(float64(now.Add(time.Second).UnixMilli())/1000, 'f', 3, 64), "X-RateLimit-Reset-After": "1.000", "X-RateLimit-Bucket": "abc"},
			a:        Announcement{Profile: Discord, Limits: []Limit{{Policy: "abc", Quota: 5, Remaining: 1, Reset: 2500 * time.Millisecond}}},
			want: map[string]string{"X-Ratelimit-Remaining": "1", "X-Ratelimit-Reset": strconv.FormatFloat(float64(now.Add(2500*time.Millisecond).UnixMilli())/1000, 'f', 3, 64),
				"X-Ratelimit-Reset-After": "2.500", "X-Ratelimit-Bucket": "abc"},
		},
		{
			name:     "shopify: used raised to what the shared budget leaves",
			upstream: map[string]string{"X-Shopify-Shop-Api-Call-Limit": "10/40"},
			a:        Announcement{Profile: Shopify, Limits: []Limit{{Policy: "rest", Quota: 40, Remaining: 5, Reset: time.Second}}},
			want:     map[string]string{"X-Shopify-Shop-Api-Call-Limit": "35/40", "X-Ratelimit-Limit": ""},
		},
		{
			name:     "ietf: the seed's fields, the upstream's removed",
			upstream: map[string]string{"X-RateLimit-Limit": "120", "X-RateLimit-Remaining": "100", "X-RateLimit-Reset": "50"},
			a:        Announcement{Profile: IETF, Limits: []Limit{{Policy: "default", Quota: 120, Window: time.Minute, Remaining: 3, Reset: 58 * time.Second}}, Wait: 15 * time.Second},
			want:     map[string]string{"X-Ratelimit-Limit": "120", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "15", "Ratelimit": `"default";r=0;t=15`},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.upstream {
				h.Set(k, v)
			}
			tt.a.Now = now
			WriteFields(h, tt.a)
			got := map[string]string{}
			for k := range tt.want {
				got[k] = h.Get(k)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("fields (-want +got):\n%s\nall: %v", diff, h)
			}
		})
	}
}

// No field WriteFields writes is more generous than the upstream's own:
// over many upstream states and budgets, each remaining is at most the
// upstream's and each reset no earlier.
func TestWriteFieldsNeverMoreGenerous(t *testing.T) {
	now := time.Date(2026, 12, 1, 20, 0, 0, 300e6, time.UTC)
	for _, upRem := range []int{0, 1, 5, 30} {
		for _, upReset := range []time.Duration{0, 900 * time.Millisecond, 5 * time.Second} {
			for _, shRem := range []int64{0, 3, 40} {
				for _, shReset := range []time.Duration{0, 2 * time.Second, 10 * time.Second} {
					for _, wait := range []time.Duration{0, 4 * time.Second} {
						h := http.Header{}
						h.Set("X-RateLimit-Limit", "30")
						h.Set("X-RateLimit-Remaining", strconv.Itoa(upRem))
						h.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(upReset).Unix(), 10))
						h.Set("x-ratelimit-remaining-requests", strconv.Itoa(upRem))
						h.Set("x-ratelimit-reset-requests", upReset.String())
						WriteFields(h, Announcement{Profile: GitHub, Now: now, Wait: wait,
							Limits: []Limit{{Policy: "p", Quota: 30, Remaining: shRem, Reset: shReset}}})
						rem, _ := strconv.Atoi(h.Get("X-RateLimit-Remaining"))
						reset, _ := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
						if rem > upRem || reset < now.Add(upReset).Unix() {
							t.Errorf("upstream %d until +%v, shared %d until +%v, wait %v: wrote %d until %d", upRem, upReset, shRem, shReset, wait, rem, reset-now.Unix())
						}
						if wait > 0 && (rem != 0 || time.Unix(reset, 0).Before(now.Add(wait))) {
							t.Errorf("wait %v: wrote %d until +%ds, want 0 until the wait", wait, rem, reset-now.Unix())
						}
					}
				}
			}
		}
	}
}

// BenchmarkWriteFields states the reference API's one policy on its own
// answer, as the REST side does on every call.
func BenchmarkWriteFields(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		stateOnSeedAnswer()
	}
}
