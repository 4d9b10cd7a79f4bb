// Package ratelimit reads and writes the rate-limit signals of HTTP
// responses: Retry-After (RFC 9110), the RateLimit and RateLimit-Policy
// fields of draft-ietf-httpapi-ratelimit-headers (revision -11 and the
// shapes of earlier revisions still in the wild), vendor X-RateLimit-*
// headers read through a per-API Profile, RFC 9457 problem details, and
// throttling reported in response bodies.
//
// It is the only package that knows header names. Everything else sees
// normalised values: a Reading per response, made of Observations that
// keep their policy, unit, partition and provenance.
//
// # Reading
//
// Read is a pure function of a Response, a Profile and the receive time;
// it is safe for concurrent use, never panics, and is bounded on hostile
// input (a structured field over 8 KiB or 64 members, a scalar field over
// 64 bytes and a body beyond MaxBody are not parsed). What it reads:
//
//   - Retry-After, under every profile and on any status: delay-seconds
//     and the three HTTP-date forms, the dates measured against the
//     response's Date so a skewed local clock cannot shorten the wait.
//     Leniencies are warned (and flagged, Reading.Lenient, for a decimal
//     or a mis-cased date): a decimal is rounded up; a date in lower case
//     is read as the instant it names; a date in the past is 0; a number
//     beyond MaxRetryAfter that is a plausible epoch (seconds or
//     milliseconds within 7 days of Date) is read as that instant, any
//     other is capped to MaxRetryAfter; negatives and other text are
//     ignored. Of several waits (several lines, retry-after-ms, a body
//     retry_after, a google.rpc.Status's RetryInfo, a Shopify GraphQL
//     cost), the longest is kept. A wait written in an error message's
//     prose ("Please try again in 634ms") is a hint, flagged
//     (Reading.RetryAfterHint), kept only when it is the longest.
//   - RateLimit-Policy and RateLimit (draft-11), joined by policy name and
//     partition key into one Observation per policy; the -07 Dictionary;
//     and RateLimit-Limit/-Remaining/-Reset(/-Policy) of drafts -00 to
//     -06 (not under GitLab, whose fields reuse these names). A malformed
//     field is ignored as a whole; an invalid item within a valid field is
//     ignored alone.
//   - The profile's vendor fields, each profile a row of function values
//     in one table (profile.go); see Profile and the README. A
//     reset sent as an instant (an epoch, a date) is measured from the
//     receive time when it agrees with Date to within a second (Date is
//     floored to the second), else from Date.
//   - Problem details and a google.rpc.Status's QuotaFailure, under every
//     profile: the policies they name violated are exhausted for the
//     answer's own wait when it has one (their window shapes the pace
//     after it), unless their own r=0 and t prove a longer one. GraphQL
//     errors where the profile says so.
//   - Age and X-From-Cache: such a Reading is FromCache.
//
// When an older or vendor shape describes the same policy as a more
// authoritative one in the same response (the draft-11 fields, then -07,
// then -03, then vendor fields), the two are merged into one Observation
// with the stricter values and a warning if they disagree; when the match
// is ambiguous they are kept apart, with a warning. Duplicate draft items
// for one policy are combined the same way. Nothing is ever loosened: no
// value is raised by merging, a negative vendor count means "unknown", and
// huge values are kept but warned about (clamping is the pacer's job).
//
// # Writing
//
// WriteFields states a key's shared budget in the fields its clients'
// SDKs read: the IETF ones, and the profile's own vendor fields in the
// vendor's names and formats (the upstream's, tightened, or written from
// the budget), never more generous than the upstream. SetHeaders and
// SetRetryAfter write the IETF and the reference API's fields alone; StripHeaders
// removes an upstream's, so that a more generous upstream value never
// shows through.
//
// The types are plain values; their zero values are documented on each.
package ratelimit
