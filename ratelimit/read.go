package ratelimit

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"time"
)

// Bounds that keep Read cheap on hostile input: a structured field longer
// than maxFieldLen (all its lines together) or with more than maxMembers
// members is ignored as a whole, and at most maxWarnings warnings are kept.
const (
	maxFieldLen = 8 << 10
	maxMembers  = 64
	maxWarnings = 32
)

// Read returns everything resp says about rate limits, read under profile
// p, as received at now. It is pure: it looks only at its arguments and
// never panics. A malformed signal is ignored and recorded in
// Reading.Warnings, never half-applied; see the package documentation for
// what is read under which profile, and the README for a summary.
//
// An unknown profile is read as Generic, with a warning.
func Read(p Profile, resp Response, now time.Time) (r Reading) {
	defer func() {
		if v := recover(); v != nil {
			// A bug, not an input error; keep the caller alive with what
			// was read so far. The fuzz targets call read directly.
			r.ReceivedAt = now
			r.Warnings = append(r.Warnings, fmt.Sprintf("internal error reading rate-limit signals: %v", v))
		}
	}()
	return read(p, resp, now)
}

// read is Read without the safety net.
func read(p Profile, resp Response, now time.Time) Reading {
	rd := newReader(p, resp, now)
	rd.readDate()
	rd.readCache()
	rd.readBody()
	rd.readRetryAfter()

	rd.readDraft()      // draft-11 and -07 (RateLimit, RateLimit-Policy)
	rd.readOldDraft()   // draft-03 (RateLimit-Limit/-Remaining/-Reset)
	rd.readVendor()     // the profile's fields
	rd.readBodySignal() // problem details, GraphQL errors
	rd.merge()
	rd.finish()
	return rd.r
}

// An entry is an observation under construction, with what merging needs
// to know about it.
type entry struct {
	Observation
	// mergeable marks an observation of an older or vendor shape that
	// describes the same unnamed policy as the draft fields, when both are
	// sent; see merge.
	mergeable bool
}

// A reader holds the state of one Read.
type reader struct {
	p    Profile
	h    http.Header
	body []byte
	resp Response
	now  time.Time
	ref  time.Time // the response's Date when valid, else now: Retry-After's dates and epochs are measured from it
	// resetRef is what the instants of reset fields (epochs, dates) are
	// measured from: now when it agrees with the response's Date, else
	// Date (see readDate).
	resetRef time.Time

	r       Reading
	entries []entry
	doc     *bodyDoc      // the body, decoded when it is JSON; nil otherwise
	google  *googleStatus // the body's google.rpc.Status; nil when it is none

	legacy     []legacyPolicy // RateLimit-Policy items of drafts -04 to -07
	legacyUsed bool           // a draft-07 RateLimit consumed them
}

func newReader(p Profile, resp Response, now time.Time) *reader {
	rd := &reader{p: p, resp: resp, now: now, ref: now, resetRef: now}
	rd.r.ReceivedAt = now
	if p == "" {
		rd.p = Generic
	} else if !p.Valid() {
		rd.p = Generic
		rd.warnf("unknown profile %s, read as generic", quote(string(p)))
	}
	rd.h = canonical(resp.Header)
	rd.body = resp.Body
	if len(rd.body) > MaxBody {
		rd.body = rd.body[:MaxBody]
	}
	return rd
}

// canonical returns h with canonical keys, copying it only when some key
// is not canonical (a hand-built header map).
func canonical(h http.Header) http.Header {
	if h == nil {
		return http.Header{}
	}
	for k := range h {
		if textproto.CanonicalMIMEHeaderKey(k) != k {
			c := make(http.Header, len(h))
			for k, vs := range h {
				ck := textproto.CanonicalMIMEHeaderKey(k)
				c[ck] = append(c[ck], vs...)
			}
			return c
		}
	}
	return h
}

// warnf records a warning, up to maxWarnings of them.
func (rd *reader) warnf(format string, args ...any) {
	switch n := len(rd.r.Warnings); {
	case n < maxWarnings:
		rd.r.Warnings = append(rd.r.Warnings, fmt.Sprintf(format, args...))
	case n == maxWarnings:
		rd.r.Warnings = append(rd.r.Warnings, "further warnings omitted")
	}
}

// lines returns the field lines of name, in any spelling.
func (rd *reader) lines(name string) []string {
	return rd.h[canonicalName(name)]
}

// canonicalNames maps the field names the readers ask for in another
// spelling than the canonical one ("X-RateLimit-Limit") to it: a fixed
// set, canonicalized once each rather than on every answer.
var canonicalNames sync.Map

// canonicalName returns name's canonical form (see
// http.CanonicalHeaderKey).
func canonicalName(name string) string {
	if c, ok := canonicalNames.Load(name); ok {
		return c.(string)
	}
	c := http.CanonicalHeaderKey(name)
	if c != name {
		canonicalNames.Store(name, c)
	}
	return c
}

// scalar returns the value of a single-valued field. A field sent on
// several lines with different values is ignored with a warning: which
// line to believe is unknowable.
func (rd *reader) scalar(name string) (string, bool) {
	vs := rd.lines(name)
	if len(vs) == 0 {
		return "", false
	}
	for _, v := range vs[1:] {
		if strings.TrimSpace(v) != strings.TrimSpace(vs[0]) {
			rd.warnf("%s: sent %d times with different values, ignored", name, len(vs))
			return "", false
		}
	}
	return vs[0], true
}

// readDate reads the Date field, the reference for the instants a
// response names. Retry-After's are measured from Date, so that a skewed
// local clock cannot shorten the wait. A reset's instant (an epoch, a
// date) is measured from the receive time when that agrees with Date to
// within the second Date resolves: Date is floored to the second and an
// epoch reset rounded up to one, so a t measured from Date could run up
// to two seconds past the window's end, and one from the receive time up
// to one. When the clocks disagree by more, Date is the reference for
// both, as the server's clock is the one its instants are on.
func (rd *reader) readDate() {
	v, ok := rd.scalar("Date")
	if !ok {
		return
	}
	t, ok := parseHTTPDate(v)
	if !ok {
		rd.warnf("Date: not an HTTP-date %s, local time used instead", quote(v))
		return
	}
	rd.r.ServerDate = t
	rd.ref = t
	if d := rd.now.Sub(t); d <= -time.Second || d >= time.Second {
		rd.resetRef = t
	}
}

// readCache marks a response served from a cache: Age > 0 (RFC 9111 §5.1,
// Age = delta-seconds) or X-From-Cache (set by Go HTTP caches). Draft §7.3:
// values from such responses SHOULD be ignored; the observations are kept
// but flagged.
func (rd *reader) readCache() {
	if v, ok := rd.scalar("Age"); ok {
		if n, ok := parseCount(v); ok {
			if n > 0 {
				rd.r.FromCache = true
			}
		} else {
			rd.warnf("Age: not delta-seconds %s, ignored", quote(v))
		}
	}
	if v, ok := rd.scalar("X-From-Cache"); ok {
		switch v = strings.TrimSpace(v); {
		case v == "0" || strings.EqualFold(v, "false") || strings.EqualFold(v, "no"):
		default:
			rd.r.FromCache = true
		}
	}
}

// add appends an observation, defaulting its unit to Requests.
func (rd *reader) add(o Observation, mergeable bool) {
	if o.Unit == "" {
		o.Unit = Requests
	}
	rd.entries = append(rd.entries, entry{o, mergeable})
}

// finish derives the flags that depend on everything read, and copies the
// observations out.
func (rd *reader) finish() {
	if rd.resp.Status == http.StatusTooManyRequests {
		rd.r.Throttled = true
	}
	for _, e := range rd.entries {
		if e.Unit == "" {
			e.Unit = Requests
		}
		rd.r.Observations = append(rd.r.Observations, e.Observation)
	}
	if rd.r.FromCache && len(rd.r.Observations) > 0 {
		rd.warnf("response served from a cache: its observations are not fresh")
	}
}
