package ratelimit_test

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// Read normalises what a response says about rate limits. Here the seed
// API's refusal: a 429 with Retry-After, the draft fields, and a problem.
func ExampleRead() {
	now := time.Date(2026, 5, 23, 12, 0, 0, 0, time.UTC)
	resp := ratelimit.Response{
		Status: http.StatusTooManyRequests,
		Header: http.Header{
			"Date":             {"Sat, 23 May 2026 12:00:00 GMT"},
			"Retry-After":      {"18"},
			"Ratelimit-Policy": {`"default";q=120;w=60`},
			"Ratelimit":        {`"default";r=0;t=18`},
			"Content-Type":     {"application/problem+json"},
		},
		Body: []byte(`{"status": 429, "code": "rateLimited", "detail": "Try again in 18 seconds."}`),
	}
	r := ratelimit.Read(ratelimit.IETF, resp, now)
	fmt.Println("throttled:", r.Throttled, "code:", r.Problem.Code)
	fmt.Println("retry after:", r.RetryAfter)
	for _, o := range r.Observations {
		fmt.Printf("policy %q: %d of %d %s per %v left, for %v\n",
			o.Policy, o.Remaining, o.Quota, o.Unit, o.Window, o.Reset)
	}
	// Output:
	// throttled: true code: rateLimited
	// retry after: 18s
	// policy "default": 0 of 120 requests per 1m0s left, for 18s
}

// A profile says what vendor fields mean: GitHub's reset is an epoch, and
// its resource is the partition.
func ExampleRead_gitHub() {
	now := time.Date(2026, 5, 23, 12, 0, 0, 0, time.UTC)
	resp := ratelimit.Response{Status: http.StatusOK, Header: http.Header{
		"Date":                  {"Sat, 23 May 2026 12:00:00 GMT"},
		"X-Ratelimit-Limit":     {"5000"},
		"X-Ratelimit-Remaining": {"4997"},
		"X-Ratelimit-Reset":     {"1779538800"},
		"X-Ratelimit-Resource":  {"core"},
	}}
	o := ratelimit.Read(ratelimit.GitHub, resp, now).Observations[0]
	fmt.Printf("%s: %d of %d left, resets in %v\n", o.Partition, o.Remaining, o.Quota, o.Reset)
	// Output:
	// core: 4997 of 5000 left, resets in 20m1s
}

// SetHeaders announces quota to a client in both forms the reference API uses.
func ExampleSetHeaders() {
	h := http.Header{}
	ratelimit.SetHeaders(h, []ratelimit.Limit{{
		Policy: "default", Quota: 120, Window: time.Minute,
		Remaining: 117, Reset: 42 * time.Second,
	}})
	for _, k := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		fmt.Printf("%s: %s\n", k, h.Get(k))
	}
	// Output:
	// RateLimit-Policy: "default";q=120;w=60
	// RateLimit: "default";r=117;t=42
	// X-RateLimit-Limit: 120
	// X-RateLimit-Remaining: 117
	// X-RateLimit-Reset: 42
}

func ExampleParseProfile() {
	p, err := ratelimit.ParseProfile("GitHub")
	fmt.Println(p, err)
	_, err = ratelimit.ParseProfile("twitter")
	fmt.Println(err)
	// Output:
	// github <nil>
	// unknown rate-limit profile "twitter" (valid: generic, ietf, github, openai, anthropic, discord, shopify, gitlab, reddit, jira, google, x, kong, slack, stripe)
}

// A GitHub answer passes with GitHub's own fields, its remaining lowered
// to what every caller of the key together may still spend and its epoch
// reset moved later to match; mcp-quota's view goes in RateLimit.
func ExampleWriteFields() {
	now := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "5000")
	h.Set("X-RateLimit-Remaining", "4990")
	h.Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(20*time.Minute).Unix(), 10))
	h.Set("X-RateLimit-Used", "10")
	h.Set("X-RateLimit-Resource", "core")
	ratelimit.WriteFields(h, ratelimit.Announcement{Profile: ratelimit.GitHub, Now: now, Limits: []ratelimit.Limit{
		{Policy: "core", Quota: 5000, Window: time.Hour, Remaining: 120, Reset: 30 * time.Minute}}})
	for _, k := range []string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Used", "X-Ratelimit-Resource", "Ratelimit-Policy", "Ratelimit"} {
		fmt.Printf("%s: %s\n", k, h.Get(k))
	}
	reset, _ := strconv.ParseInt(h.Get("X-Ratelimit-Reset"), 10, 64)
	fmt.Println("X-Ratelimit-Reset: now +", time.Unix(reset, 0).Sub(now))
	// Output:
	// X-Ratelimit-Limit: 5000
	// X-Ratelimit-Remaining: 120
	// X-Ratelimit-Used: 4880
	// X-Ratelimit-Resource: core
	// Ratelimit-Policy: "core";q=5000;w=3600
	// Ratelimit: "core";r=120;t=1800
	// X-Ratelimit-Reset: now + 30m0s
}
