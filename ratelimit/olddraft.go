package ratelimit

import (
	"fmt"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
)

// Shapes of earlier draft revisions, still sent by gateways and libraries
// (Kong, Envoy, express-rate-limit, …):
//
// draft-07, one Dictionary (with RateLimit-Policy as in -04 to -07):
//
//	RateLimit        = sf-dictionary   ; limit=100, remaining=50, reset=5
//	  limit, remaining, reset : Integer >= 0   (reset in delta seconds)
//	RateLimit-Policy = sf-list         ; 100;w=10
//
// drafts -00 to -06, separate fields (ABNF in polli-00 to ietf-01, RFC 8941
// from ietf-02; both parse as Structured Fields):
//
//	RateLimit-Limit     = expiring-limit [ "," 1#quota-policy ]   ; 100, 100;w=60
//	quota-policy        = Integer ";" ( "w" / "window" ) "=" Integer *( ";" comment )
//	RateLimit-Remaining = Integer
//	RateLimit-Reset     = delta-seconds   ; polli-00 also allowed IMF-fixdate
//	RateLimit-Policy    = 1#quota-policy  ; -04 to -06
//
// A RateLimit-Reset of 1e9 or more is not plausible as delta-seconds; when
// it is a plausible epoch (within 7 days of the response's Date) it is
// read as one, marked Guessed, with a warning (GitLab sends an epoch under
// this name; the GitLab profile reads it as one without guessing).
//
// Observations of these shapes are unnamed when at most one quota policy
// is known; with several, each is named by its quota and window
// ("100-in-60s") so that they stay apart.

// legacyName names an observation of an older draft shape.
func legacyName(q int64, w time.Duration, several bool) string {
	if !several || w == 0 {
		return ""
	}
	return fmt.Sprintf("%d-in-%ds", q, int64(w/time.Second))
}

// A legacyLimit is what one response said in an older draft shape.
type legacyLimit struct {
	quota, remaining       int64
	hasQuota, hasRemaining bool
	reset                  time.Duration
	hasReset, guessed      bool
}

// legacyObservations turns a legacy limit and the quota policies known
// alongside it into observations: the limit takes the window of the one
// policy with its quota; the other policies become policy-only
// observations.
func legacyObservations(l legacyLimit, policies []legacyPolicy, shape Shape, profile Profile) (out []entry) {
	policies = uniqueLegacy(policies)
	several := len(policies) > 1
	matched := -1
	if l.hasQuota {
		for i, p := range policies {
			if p.q == l.quota {
				if matched >= 0 { // two windows for one quota: ambiguous
					matched = -2
					break
				}
				matched = i
			}
		}
	}
	if l.hasQuota || l.hasRemaining || l.hasReset {
		o := Observation{Unit: Requests, Quota: l.quota, HasQuota: l.hasQuota, Remaining: l.remaining, HasRemaining: l.hasRemaining,
			Reset: l.reset, HasReset: l.hasReset, Guessed: l.guessed, Shape: shape, Profile: profile}
		if matched >= 0 {
			o.Window = policies[matched].w
			o.Policy = legacyName(o.Quota, o.Window, several)
		}
		out = append(out, entry{o, true})
	}
	for i, p := range policies {
		if i == matched {
			continue
		}
		out = append(out, entry{Observation{Policy: legacyName(p.q, p.w, several), Unit: Requests, Quota: p.q, HasQuota: true,
			Window: p.w, Shape: shape, Profile: profile}, false})
	}
	return out
}

func uniqueLegacy(ps []legacyPolicy) (out []legacyPolicy) {
	for _, p := range ps {
		dup := false
		for _, o := range out {
			dup = dup || o == p
		}
		if !dup {
			out = append(out, p)
		}
	}
	return out
}

// readDraft07 reads a RateLimit field that is the -07 Dictionary. ok is
// false when the field is not one (then it is malformed).
func (rd *reader) readDraft07(lines []string) (es []entry, ok bool) {
	l, warn, ok := parseDraft07(lines)
	if !ok {
		return nil, false
	}
	if warn != "" {
		rd.warnf("%s", warn)
		return nil, true
	}
	rd.legacyUsed = true
	return legacyObservations(l, rd.legacy, ShapeDraft07, ""), true
}

// parseDraft07 parses the -07 Dictionary. ok is false when lines are not a
// Dictionary with at least one of limit, remaining and reset; warn is set
// (and the field ignored as a whole) when one of them is not a
// non-negative Integer.
func parseDraft07(lines []string) (l legacyLimit, warn string, ok bool) {
	n := 0
	for _, s := range lines {
		n += len(s) + 2
	}
	if n > maxFieldLen || separators(lines) > maxSeparators {
		return l, "", false
	}
	d, err := httpsfv.UnmarshalDictionary(lines)
	if err != nil || len(d.Names()) > maxMembers {
		return l, "", false
	}
	found := false
	for _, k := range []string{"limit", "remaining", "reset"} {
		m, present := d.Get(k)
		if !present {
			continue
		}
		found = true
		it, isItem := m.(httpsfv.Item)
		v, isInt := it.Value.(int64)
		if !isItem || !isInt || v < 0 {
			return legacyLimit{}, fmt.Sprintf("RateLimit: draft-07 %s is not a non-negative integer; the field is ignored as a whole", k), true
		}
		switch k {
		case "limit":
			l.quota, l.hasQuota = v, true
		case "remaining":
			l.remaining, l.hasRemaining = v, true
		case "reset":
			l.reset, _ = seconds(v)
			l.hasReset = true
		}
	}
	return l, "", found
}

// parseLegacyLimit parses a RateLimit-Limit of drafts -00 to -06 (or an
// X-RateLimit-Limit in that form, as Envoy and WHOOP send it): the
// expiring limit, and the quota policies after it.
func parseLegacyLimit(field string, lines []string) (quota int64, policies []legacyPolicy, warns []string, ok bool) {
	list, err := parseList(field, lines)
	if err != nil {
		return 0, nil, []string{err.Error()}, false
	}
	if len(list) == 0 {
		return 0, nil, nil, false
	}
	for i, m := range list {
		it, isItem := m.(httpsfv.Item)
		q, isInt := it.Value.(int64)
		if !isItem || !isInt || q < 0 {
			if i == 0 {
				return 0, nil, []string{fmt.Sprintf("%s: the limit is not a non-negative integer, ignored", field)}, false
			}
			warns = append(warns, fmt.Sprintf("%s: member %d is not a quota policy, ignored", field, i+1))
			continue
		}
		if i == 0 {
			quota = q
		}
		_, hasW := it.Params.Get("w")
		_, hasWindow := it.Params.Get("window")
		if i == 0 && !hasW && !hasWindow {
			continue
		}
		p, warn := parseLegacyPolicy(q, it.Params)
		if warn != "" {
			warns = append(warns, fmt.Sprintf("%s: member %d: %s", field, i+1, warn))
			continue
		}
		if p.w > 0 {
			policies = append(policies, p)
		}
	}
	return quota, policies, warns, true
}

// parseLegacyCount parses RateLimit-Remaining (an Integer >= 0).
func parseLegacyCount(field string, lines []string) (int64, string, bool) {
	v := strings.TrimSpace(strings.Join(lines, ","))
	n, ok := parseCount(v)
	if !ok {
		return 0, fmt.Sprintf("%s: not a non-negative integer %s, ignored", field, quote(v)), false
	}
	return n, "", true
}

// parseLegacyReset parses a draft RateLimit-Reset: delta-seconds, an
// IMF-fixdate (polli-00), or an epoch recognised by magnitude (guessed).
func parseLegacyReset(field string, lines []string, ref time.Time) (d time.Duration, guessed bool, warn string, ok bool) {
	v := strings.TrimSpace(strings.Join(lines, ","))
	if t, ok := parseHTTPDate(v); ok {
		d, past, _ := until(t, ref)
		if past {
			return 0, false, fmt.Sprintf("%s: date %s is in the past, read as 0s", field, quote(v)), true
		}
		return d, false, "", true
	}
	n, ok := parseCount(v)
	if !ok {
		return 0, false, fmt.Sprintf("%s: not delta-seconds %s, ignored", field, quote(v)), false
	}
	if n < 1e9 {
		d, _ = seconds(n)
		return d, false, "", true
	}
	t, ok := guessEpoch(float64(n), ref)
	if !ok {
		return 0, false, fmt.Sprintf("%s: %s is neither plausible delta-seconds nor a plausible epoch, ignored", field, quote(v)), false
	}
	d, past, _ := until(t, ref)
	if past {
		return 0, true, fmt.Sprintf("%s: %s read as an epoch (guessed), in the past: 0s", field, quote(v)), true
	}
	return d, true, fmt.Sprintf("%s: %s read as an epoch, not delta-seconds (guessed): %v", field, quote(v), d), true
}

// readOldDraft reads RateLimit-Limit/-Remaining/-Reset of drafts -00 to
// -06, and the -04 to -07 RateLimit-Policy when nothing else used it.
// Under GitLab these names mean GitLab's fields and are read by the
// profile instead.
func (rd *reader) readOldDraft() {
	if rd.row().ownsDraft03 {
		return
	}
	var l legacyLimit
	var policies []legacyPolicy
	if !rd.legacyUsed { // a draft-07 RateLimit already took them
		policies = rd.legacy
	}
	if lines := rd.lines("RateLimit-Limit"); len(lines) > 0 {
		q, ps, warns, ok := parseLegacyLimit("RateLimit-Limit", lines)
		rd.warnAll(warns)
		if ok {
			l.quota, l.hasQuota = q, true
			policies = append(policies, ps...)
		}
	}
	if lines := rd.lines("RateLimit-Remaining"); len(lines) > 0 {
		n, warn, ok := parseLegacyCount("RateLimit-Remaining", lines)
		if warn != "" {
			rd.warnf("%s", warn)
		}
		l.remaining, l.hasRemaining = n, ok
	}
	if lines := rd.lines("RateLimit-Reset"); len(lines) > 0 {
		d, guessed, warn, ok := parseLegacyReset("RateLimit-Reset", lines, rd.resetRef)
		if warn != "" {
			rd.warnf("%s", warn)
		}
		l.reset, l.hasReset, l.guessed = d, ok, guessed
	}
	if !l.hasQuota && !l.hasRemaining && !l.hasReset && len(policies) == 0 {
		return
	}
	rd.entries = append(rd.entries, legacyObservations(l, policies, ShapeDraft03, "")...)
}
