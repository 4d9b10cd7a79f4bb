package ratelimit

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// A Profile says how to read the vendor headers of one API. The draft
// fields (RateLimit, RateLimit-Policy and the older RateLimit-* shapes)
// and Retry-After are read under every profile; the profile decides what
// X-RateLimit-* and other vendor fields mean, because their meaning
// differs per vendor. The zero value is Generic.
type Profile string

// The profiles mcp-quota knows.
const (
	// Generic reads X-RateLimit-Limit/-Remaining/-Reset and decides whether
	// Reset is an epoch or a delta by its magnitude, recording the guess.
	Generic Profile = "generic"
	// IETF reads the draft fields, and X-RateLimit-* as the reference API sends
	// them: Limit and Remaining in requests, Reset in delta seconds.
	IETF Profile = "ietf"
	// GitHub reads x-ratelimit-limit/-remaining/-reset (epoch seconds) with
	// x-ratelimit-resource as the partition, secondary rate limits (403/429
	// with a "secondary rate limit" message) and GraphQL RATE_LIMITED errors.
	GitHub Profile = "github"
	// OpenAI reads x-ratelimit-{limit,remaining,reset}-{requests,tokens}
	// (Go-style durations such as 6m0s) as two policies, retry-after-ms and
	// x-should-retry.
	OpenAI Profile = "openai"
	// Anthropic reads anthropic-ratelimit-*-{limit,remaining,reset} (RFC 3339
	// resets) for requests and each token class, the unified 5h and 7d
	// windows of subscription traffic (anthropic-ratelimit-unified-*, in
	// Percent), retry-after-ms and x-should-retry.
	Anthropic Profile = "anthropic"
	// Discord reads X-RateLimit-* with the float Reset-After, the bucket as
	// the partition, the scope, and the body's retry_after.
	Discord Profile = "discord"
	// Shopify reads X-Shopify-Shop-Api-Call-Limit (used/size) as a leaky
	// bucket (ShapeLeaky), and GraphQL cost and THROTTLED errors in the
	// body, a THROTTLED answer with the wait its cost implies.
	Shopify Profile = "shopify"
	// GitLab reads RateLimit-Limit/-Remaining/-Reset as GitLab sends them
	// (Reset is an epoch, not the draft's delta) and RateLimit-Name as the
	// policy; a 429 outranks a Remaining above 0.
	GitLab Profile = "gitlab"
	// Reddit reads X-Ratelimit-Used/-Remaining (a float)/-Reset (delta).
	Reddit Profile = "reddit"
	// Jira reads X-RateLimit-* with a minute-precision ISO 8601 reset,
	// RateLimit-Reason as the policy, the Beta-RateLimit(-Policy) draft
	// fields and X-Beta-RateLimit-Reset.
	Jira Profile = "jira"
	// Google reads nothing beyond what every profile reads (the
	// google.rpc.Status error body among it): its APIs send no rate-limit
	// fields, only RetryInfo and QuotaFailure on a RESOURCE_EXHAUSTED.
	Google Profile = "google"
	// X reads X (Twitter) API v2's x-rate-limit-limit/-remaining/-reset
	// (epoch) and the 24-hour x-user-limit-24hour-* and
	// x-app-limit-24hour-* windows.
	X Profile = "x"
	// Kong reads the rate-limiting plugin's X-RateLimit-Limit-<Period> and
	// X-RateLimit-Remaining-<Period>, one policy per period.
	Kong Profile = "kong"
	// Slack reads the Web API's {"ok": false, "error": "ratelimited"}
	// bodies; its 429s carry only Retry-After.
	Slack Profile = "slack"
	// Stripe reads Stripe-Should-Retry and Stripe-Rate-Limited-Reason.
	Stripe Profile = "stripe"
)

// Profiles returns every profile Read knows, Generic first.
func Profiles() []Profile {
	return []Profile{Generic, IETF, GitHub, OpenAI, Anthropic, Discord, Shopify, GitLab, Reddit, Jira,
		Google, X, Kong, Slack, Stripe}
}

// Valid reports whether p is a profile Read knows. The zero value counts as
// Generic and is valid.
func (p Profile) Valid() bool {
	if p == "" {
		return true
	}
	_, ok := profileTable[p]
	return ok
}

// ReadsSuccessBody reports whether p finds signals in the body of a
// successful (2xx) JSON answer — GraphQL errors and costs, Slack's
// "ok": false — so that a transport knows to hand it to Read. Error
// bodies (4xx, 5xx) matter under every profile.
func (p Profile) ReadsSuccessBody() bool {
	return profileTable[p].successBody
}

// PartitionsByRoute reports whether a partition p reads (Discord's
// X-RateLimit-Bucket) is a bucket of the route that reported it, saying
// nothing of calls on other routes; otherwise a partition may hold for
// any route (an IETF pk, GitHub's resource).
func (p Profile) PartitionsByRoute() bool {
	return profileTable[p].partitionsByRoute
}

// ParseProfile returns the profile named name, ignoring case and
// surrounding space. The empty name is Generic. An unknown name is an
// error that lists the valid names.
func ParseProfile(name string) (Profile, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == "" {
		return Generic, nil
	}
	if p := Profile(n); p.Valid() {
		return p, nil
	}
	names := make([]string, 0, len(Profiles()))
	for _, p := range Profiles() {
		names = append(names, string(p))
	}
	return "", fmt.Errorf("unknown rate-limit profile %q (valid: %s)", name, strings.Join(names, ", "))
}

// A Unit is what a quota counts. The draft defines requests,
// content-bytes and concurrent-requests; vendor profiles add tokens.
type Unit string

// Units in use.
const (
	Requests           Unit = "requests"
	ContentBytes       Unit = "content-bytes"
	ConcurrentRequests Unit = "concurrent-requests"
	Tokens             Unit = "tokens"
	InputTokens        Unit = "input-tokens"
	OutputTokens       Unit = "output-tokens"
	// Points are a vendor's calculated query cost (Shopify GraphQL).
	Points Unit = "points"
	// Percent is a share of a quota whose size the vendor does not say
	// (Anthropic's unified windows report utilization as a fraction).
	Percent Unit = "percent"
)

// MaxRetryAfter caps every wait Read reports in Reading.RetryAfter. A
// longer server-directed wait (or an epoch sent as delay-seconds that is
// not a plausible instant) is reported as MaxRetryAfter with a warning:
// the caller should surface such a wait rather than sleep on it.
const MaxRetryAfter = 24 * time.Hour

// MaxBody is how much of a response body Read looks at; the rest is
// ignored. Callers need not read more than this.
const MaxBody = 64 << 10

// A Shape names the form a value was read from, so that every observation
// can say where it came from.
type Shape string

// Shapes a response can carry.
const (
	ShapeDraft    Shape = "draft-11"       // RateLimit/RateLimit-Policy Lists of Items (drafts -08 to -11)
	ShapeDraft07  Shape = "draft-07"       // RateLimit Dictionary: limit=, remaining=, reset=
	ShapeDraft03  Shape = "draft-03"       // separate RateLimit-Limit/-Remaining/-Reset(/-Policy) fields
	ShapeVendor   Shape = "vendor"         // vendor headers, read through the key's Profile
	ShapeProblem  Shape = "problem"        // RFC 9457 problem details (violated-policies)
	ShapeBody     Shape = "body"           // throttling reported in a response body (GraphQL)
	ShapeRetry    Shape = "retry-after"    // Retry-After and its vendor variants
	ShapeInferred Shape = "inferred-limit" // a limit nobody named, inferred from a refusal
	// ShapeLeaky is a vendor's leaky bucket (Shopify REST): Quota is the
	// bucket's size, Remaining the room in it now, Window the time the
	// bucket takes to drain when full (Quota/Window is the leak rate), and
	// Reset the time one unit takes to leak out. It paces as a rate, not
	// as a window: it is never counted over the sliding-window log.
	ShapeLeaky Shape = "leaky-bucket"
)

// An Observation is one time-bound statement an upstream made about one
// quota policy, in that policy's own unit and partition. It is never a
// bare "remaining": a value may be projected only within its own Policy,
// Unit, Partition and validity (ReceivedAt + Reset).
//
// Counts are meaningful only when their Has flag is set; durations are
// zero when not stated.
type Observation struct {
	Policy    string // policy name ("default", "core", "requests"…); "" when the upstream named none
	Unit      Unit   // Requests when not stated
	Partition string // pk as base64, or the vendor's resource/bucket; "" when none

	Quota    int64 // q: quota per window
	HasQuota bool

	Window time.Duration // w: the policy's window; 0 when not stated

	Remaining    int64 // r: available quota (a hint, not a grant)
	HasRemaining bool

	// Reset is t, the effective window: the time, from ReceivedAt, within
	// which no more than Remaining may be used. It is not a refill time:
	// after it the observation expires.
	Reset    time.Duration
	HasReset bool

	Shape   Shape   // which form it was read from
	Profile Profile // the profile whose fields it was read from; "" for fields every profile reads
	Guessed bool    // a value's meaning was guessed (e.g. epoch vs delta by magnitude)
	// PerRoute says the policy holds for the request's method and path
	// alone (Slack's per-method tiers), which a response does not name:
	// whoever records the observation partitions it by the request.
	PerRoute bool
}

// A Problem holds the members of an RFC 9457 problem details body that
// matter for rate limiting. Members of the wrong type are ignored.
type Problem struct {
	Type             string
	Title            string
	Status           int
	Detail           string
	Code             string   // the reference API's "code", e.g. "rateLimited"
	ViolatedPolicies []string // draft problem types' "violated-policies"
}

// Problem types of draft-ietf-httpapi-ratelimit-headers-11 §5.
const (
	ProblemQuotaExceeded            = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	ProblemAbnormalUsage            = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
)

// A Response is what Read needs of an HTTP response. Body may be a prefix
// of the real body (or nil); Read never needs more than its first 64 KiB.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// A Reading is everything one response said about rate limits, normalised.
type Reading struct {
	ReceivedAt time.Time // local receive time, as passed to Read
	ServerDate time.Time // the response's Date, when valid; zero otherwise

	Observations []Observation

	// RetryAfter is the server's decision: wait at least this long from
	// ReceivedAt. Measured against ServerDate for the HTTP-date form, so a
	// skewed local clock does not shorten it; floored and capped (see
	// Warnings). HasRetryAfter is false when the response set none.
	RetryAfter    time.Duration
	HasRetryAfter bool

	// RetryAfterHint is set when RetryAfter is a hint read from the prose
	// of an error body ("Please try again in 634ms"), not from a field. A
	// hint only ever lengthens a field's wait, never shortens it.
	RetryAfterHint bool
	// Lenient is set when a wait was read outside its grammar: a
	// mis-cased HTTP-date ("mon, 01 jun 2026 12:01:00 gmt"), a decimal
	// delay-seconds. The warning says which.
	Lenient bool

	// RetryAfterPerRoute says RetryAfter holds for the request's method
	// and path alone (Slack): a PerRoute observation carries it, and other
	// routes of the key need not wait for it.
	RetryAfterPerRoute bool

	// DoNotRetry is set when the upstream said explicitly not to retry
	// (x-should-retry: false, Stripe-Should-Retry: false).
	DoNotRetry bool

	Problem *Problem // nil when the body is not problem details

	// Throttled is set when the response reports that the call itself was
	// refused for rate limiting: a 429, a vendor's 403 rate-limit answer, a
	// rate-limit problem type, or a GraphQL body error.
	Throttled bool
	// Secondary is set on a refusal the vendor says is a wait that spends
	// no quota (GitHub's secondary limits): what it teaches is its wait,
	// not a count limit.
	Secondary bool
	// Abnormal is set when the upstream reported abnormal usage: pause and
	// warn, never retry in a loop.
	Abnormal bool

	// FromCache is set when the response was served from a cache (Age > 0,
	// X-From-Cache): its observations must not count as fresh.
	FromCache bool

	// Warnings lists, in plain words, every field that was malformed and
	// ignored, every value capped or floored, and every guess.
	Warnings []string
}

// A Limit is a quota state to announce to a client: one policy's quota and
// window, and what is available within the effective window Reset.
type Limit struct {
	Policy    string
	Unit      Unit // Requests when empty
	Quota     int64
	Window    time.Duration
	Remaining int64
	Reset     time.Duration
	// Partition is the upstream's partition the limit holds for (GitHub's
	// resource); "" when it holds for the whole key.
	Partition string
}
