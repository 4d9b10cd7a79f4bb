package ratelimit

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
)

// The draft-11 fields, as RFC 9651 Lists of Items
// (draft-ietf-httpapi-ratelimit-headers-11 §3 and §4):
//
//	RateLimit-Policy = sf-list   ; of Quota Policy Items
//	  item value : String naming the policy (Token accepted, see below)
//	  q  : Integer >= 0, REQUIRED        quota, in quota units
//	  qu : String, default "requests"    "requests" / "content-bytes" / "concurrent-requests"
//	  w  : Integer > 0                   window, in seconds
//	  pk : Byte Sequence                 partition key
//
//	RateLimit = sf-list          ; of Service Limit Items
//	  item value : String naming the policy
//	  r  : Integer >= 0, REQUIRED        available quota
//	  t  : Integer >= 0                  effective window, in seconds (not a reset time)
//	  pk : Byte Sequence                 partition key
//
// Other parameters are comments and are ignored. The rules applied:
//   - A field that fails to parse as a List, is longer than 8 KiB, or has
//     more than 64 members is ignored as a whole (RFC 9651 §4.2), with a
//     warning. Field lines are joined with ", " before parsing.
//   - An item whose known parameter is missing (q, r) or of the wrong type
//     or sign (a Decimal r, a negative q, w=0) is ignored, with a warning;
//     the rest of the field stands.
//   - Token names are accepted like Strings and without a warning: the
//     draft has not settled which it wants (issue #158).
//   - Duplicate items for one (name, pk) are combined into the stricter
//     one: the lowest q and r, the longest w and t, with a warning.
//   - RateLimit items are joined to RateLimit-Policy items by name and
//     partition key; a policy without an r is still an observation.

// A draftPolicy is one RateLimit-Policy item.
type draftPolicy struct {
	name  string
	pk    string
	hasPK bool
	q     int64
	unit  Unit
	w     time.Duration
}

// A draftLimit is one RateLimit item.
type draftLimit struct {
	name  string
	pk    string
	hasPK bool
	r     int64
	t     time.Duration
	hasT  bool
}

// A legacyPolicy is a quota policy of drafts -02 to -07: "100;w=60".
type legacyPolicy struct {
	q int64
	w time.Duration
}

// parseList parses the lines of a field as an RFC 9651 List, within the
// size bounds.
func parseList(field string, lines []string) (httpsfv.List, error) {
	n := 0
	for _, l := range lines {
		n += len(l) + 2
	}
	if n > maxFieldLen {
		return nil, fmt.Errorf("%s: longer than %d bytes, ignored", field, maxFieldLen)
	}
	if separators(lines) > maxSeparators {
		return nil, fmt.Errorf("%s: more than %d members and parameters, ignored as a whole", field, maxSeparators)
	}
	l, err := httpsfv.UnmarshalList(lines)
	if err != nil {
		return nil, fmt.Errorf("%s: malformed structured field (%v), ignored as a whole", field, err)
	}
	if len(l) > maxMembers {
		return nil, fmt.Errorf("%s: more than %d members, ignored as a whole", field, maxMembers)
	}
	return l, nil
}

// maxSeparators bounds the commas and semicolons of a structured field,
// so that a hostile field cannot make the parser build thousands of
// members or parameters before the member bound rejects it. A real field
// has a few members of a few parameters each.
const maxSeparators = 8 * maxMembers

// separators counts the commas and semicolons in lines (those inside
// Strings too: an over-estimate is fine).
func separators(lines []string) int {
	n := len(lines) - 1
	for _, l := range lines {
		n += strings.Count(l, ",") + strings.Count(l, ";")
	}
	return n
}

// itemName returns the policy name an item carries: a String, or a Token.
func itemName(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case httpsfv.Token:
		return string(v), true
	}
	return "", false
}

// nonNegInt returns a parameter that must be a non-negative Integer.
// present is false when the parameter is absent.
func nonNegInt(p *httpsfv.Params, key string) (n int64, present, ok bool) {
	v, present := p.Get(key)
	if !present {
		return 0, false, false
	}
	n, ok = v.(int64)
	return n, true, ok && n >= 0
}

// partitionKey returns the pk parameter as base64.
func partitionKey(p *httpsfv.Params) (pk string, present, ok bool) {
	v, present := p.Get("pk")
	if !present {
		return "", false, false
	}
	b, ok := v.([]byte)
	if !ok {
		return "", true, false
	}
	return base64.StdEncoding.EncodeToString(b), true, true
}

// parseUnit maps a qu value to a Unit. The draft's registry lists
// "request" where §3.1.2 defines "requests"; both are accepted, and -08's
// "bytes" is read as content-bytes. Other units are kept as sent.
func parseUnit(v any) (u Unit, warn string, ok bool) {
	s, ok := itemName(v)
	if !ok {
		return "", "", false
	}
	switch s {
	case "requests", "request":
		return Requests, "", true
	case "content-bytes":
		return ContentBytes, "", true
	case "concurrent-requests":
		return ConcurrentRequests, "", true
	case "bytes":
		return ContentBytes, `qu="bytes" (draft-08) read as content-bytes`, true
	}
	return Unit(s), fmt.Sprintf("unknown quota unit %s, kept as sent", quote(s)), true
}

// parsePolicies parses the lines of a RateLimit-Policy field: draft-08+
// named items, and the Integer items of drafts -04 to -07 ("100;w=60"),
// which are returned as legacy policies.
func parsePolicies(field string, lines []string) (ps []draftPolicy, legacy []legacyPolicy, warns []string) {
	list, err := parseList(field, lines)
	if err != nil {
		return nil, nil, []string{err.Error()}
	}
	for i, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			warns = append(warns, fmt.Sprintf("%s: member %d is an inner list, ignored", field, i+1))
			continue
		}
		if q, ok := it.Value.(int64); ok {
			lp, warn := parseLegacyPolicy(q, it.Params)
			if warn != "" {
				warns = append(warns, fmt.Sprintf("%s: member %d: %s", field, i+1, warn))
				continue
			}
			legacy = append(legacy, lp)
			continue
		}
		p, warn := parsePolicy(it)
		if warn != "" {
			warns = append(warns, fmt.Sprintf("%s: member %d: %s", field, i+1, warn))
			if p.unit == "" {
				continue
			}
		}
		ps = append(ps, p)
	}
	ps, dw := dedupePolicies(field, ps)
	return ps, legacy, append(warns, dw...)
}

// parsePolicy reads one named RateLimit-Policy item. A returned policy
// with an empty unit is invalid; warn says why.
func parsePolicy(it httpsfv.Item) (p draftPolicy, warn string) {
	name, ok := itemName(it.Value)
	if !ok {
		return p, "not a named policy, ignored"
	}
	p.name = name
	q, present, ok := nonNegInt(it.Params, "q")
	if !present {
		return draftPolicy{}, fmt.Sprintf("policy %s has no q, ignored", quote(name))
	}
	if !ok {
		return draftPolicy{}, fmt.Sprintf("policy %s: q is not a non-negative integer, ignored", quote(name))
	}
	p.q = q
	p.unit = Requests
	if v, present := it.Params.Get("qu"); present {
		u, w, ok := parseUnit(v)
		if !ok {
			return draftPolicy{}, fmt.Sprintf("policy %s: qu is not a string, ignored", quote(name))
		}
		p.unit, warn = u, w
	}
	if w, present, ok := nonNegInt(it.Params, "w"); present {
		if !ok || w == 0 {
			return draftPolicy{}, fmt.Sprintf("policy %s: w is not a positive integer, ignored", quote(name))
		}
		p.w, _ = seconds(w)
	}
	pk, present, ok := partitionKey(it.Params)
	if present && !ok {
		return draftPolicy{}, fmt.Sprintf("policy %s: pk is not a byte sequence, ignored", quote(name))
	}
	p.pk, p.hasPK = pk, present
	if warn != "" {
		warn = fmt.Sprintf("policy %s: %s", quote(name), warn)
	}
	return p, warn
}

// parseLegacyPolicy reads a quota policy of drafts -02 to -07
// (polli-00 spelled the window "window"):
//
//	quota-policy = Integer ";" ( "w" / "window" ) "=" Integer *( ";" comment )
func parseLegacyPolicy(q int64, params *httpsfv.Params) (legacyPolicy, string) {
	if q < 0 {
		return legacyPolicy{}, "negative quota, ignored"
	}
	key := "w"
	if _, ok := params.Get("w"); !ok {
		key = "window"
	}
	w, present, ok := nonNegInt(params, key)
	if !present {
		return legacyPolicy{q: q}, ""
	}
	if !ok || w == 0 {
		return legacyPolicy{}, "window is not a positive integer, ignored"
	}
	d, _ := seconds(w)
	return legacyPolicy{q: q, w: d}, ""
}

// dedupePolicies combines policies with the same name, partition and unit
// into the stricter one.
func dedupePolicies(field string, ps []draftPolicy) (out []draftPolicy, warns []string) {
	for _, p := range ps {
		dup := false
		for i := range out {
			o := &out[i]
			if o.name != p.name || o.pk != p.pk || o.hasPK != p.hasPK || o.unit != p.unit {
				continue
			}
			dup = true
			o.q = min(o.q, p.q)
			o.w = max(o.w, p.w)
			warns = append(warns, fmt.Sprintf("%s: policy %s listed twice; the stricter values are kept (q=%d, w=%v)", field, quote(p.name), o.q, o.w))
		}
		if !dup {
			out = append(out, p)
		}
	}
	return out, warns
}

// parseLimits parses the lines of a RateLimit field as draft-08+ named
// items. It fails (err != nil) when the field is not a List, so that the
// caller may try the -07 Dictionary.
func parseLimits(field string, lines []string) (ls []draftLimit, warns []string, err error) {
	list, err := parseList(field, lines)
	if err != nil {
		return nil, nil, err
	}
	for i, m := range list {
		it, ok := m.(httpsfv.Item)
		if !ok {
			warns = append(warns, fmt.Sprintf("%s: member %d is an inner list, ignored", field, i+1))
			continue
		}
		l, warn := parseLimit(it)
		if warn != "" {
			warns = append(warns, fmt.Sprintf("%s: member %d: %s", field, i+1, warn))
			continue
		}
		ls = append(ls, l)
	}
	ls, dw := dedupeLimits(field, ls)
	return ls, append(warns, dw...), nil
}

// parseLimit reads one RateLimit item; warn is non-empty when it is invalid.
func parseLimit(it httpsfv.Item) (l draftLimit, warn string) {
	name, ok := itemName(it.Value)
	if !ok {
		return l, "not a named policy, ignored"
	}
	l.name = name
	r, present, ok := nonNegInt(it.Params, "r")
	switch {
	case !present:
		return l, fmt.Sprintf("policy %s has no r, ignored", quote(name))
	case !ok:
		return l, fmt.Sprintf("policy %s: r is not a non-negative integer, ignored", quote(name))
	}
	l.r = r
	if t, present, ok := nonNegInt(it.Params, "t"); present {
		if !ok {
			return l, fmt.Sprintf("policy %s: t is not a non-negative integer, ignored", quote(name))
		}
		l.t, _ = seconds(t)
		l.hasT = true
	}
	pk, present, ok := partitionKey(it.Params)
	if present && !ok {
		return l, fmt.Sprintf("policy %s: pk is not a byte sequence, ignored", quote(name))
	}
	l.pk, l.hasPK = pk, present
	return l, ""
}

// dedupeLimits combines limits with the same name and partition into the
// stricter one.
func dedupeLimits(field string, ls []draftLimit) (out []draftLimit, warns []string) {
	for _, l := range ls {
		dup := false
		for i := range out {
			o := &out[i]
			if o.name != l.name || o.pk != l.pk || o.hasPK != l.hasPK {
				continue
			}
			dup = true
			o.r = min(o.r, l.r)
			if l.hasT {
				o.t, o.hasT = max(o.t, l.t), true
			}
			warns = append(warns, fmt.Sprintf("%s: policy %s listed twice; the stricter values are kept (r=%d, t=%v)", field, quote(l.name), o.r, o.t))
		}
		if !dup {
			out = append(out, l)
		}
	}
	return out, warns
}

// joinDraft joins RateLimit items to RateLimit-Policy items by name and
// partition key, in the order of the policies, then the limits no policy
// described. A limit matches a policy of its name with the same pk, else
// one without a pk; a limit without a pk matches the only policy of its
// name.
func joinDraft(ps []draftPolicy, ls []draftLimit) []Observation {
	match := make([]int, len(ls)) // index into ps, or -1
	for i, l := range ls {
		match[i] = -1
		var samePK, noPK, byName []int
		for j, p := range ps {
			if p.name != l.name {
				continue
			}
			byName = append(byName, j)
			switch {
			case p.hasPK == l.hasPK && p.pk == l.pk:
				samePK = append(samePK, j)
			case !p.hasPK:
				noPK = append(noPK, j)
			}
		}
		switch {
		case len(samePK) > 0:
			match[i] = samePK[0]
		case len(noPK) > 0:
			match[i] = noPK[0]
		case !l.hasPK && len(byName) == 1:
			match[i] = byName[0]
		}
	}
	var out []Observation
	for j, p := range ps {
		joined := false
		for i, l := range ls {
			if match[i] == j {
				joined = true
				out = append(out, joinOne(&p, l))
			}
		}
		if !joined {
			o := joinOne(&p, draftLimit{})
			o.HasRemaining = false
			out = append(out, o)
		}
	}
	for i, l := range ls {
		if match[i] < 0 {
			out = append(out, joinOne(nil, l))
		}
	}
	return out
}

func joinOne(p *draftPolicy, l draftLimit) Observation {
	o := Observation{Policy: l.name, Unit: Requests, Shape: ShapeDraft,
		Remaining: l.r, HasRemaining: true, Reset: l.t, HasReset: l.hasT}
	if l.hasPK {
		o.Partition = l.pk
	}
	if p != nil {
		o.Policy, o.Unit = p.name, p.unit
		o.Quota, o.HasQuota, o.Window = p.q, true, p.w
		if !l.hasPK && p.hasPK {
			o.Partition = p.pk
		}
	}
	return o
}

// sanity returns warnings about values the draft allows but a client
// should not act on naively (§8.5): more available than the quota, and an
// r/t rate far above the policy's q/w (or above 1000 units/s with no
// policy). The values are kept: clamping is the pacer's job.
func sanity(field string, o Observation) []string {
	var w []string
	if o.HasQuota && o.HasRemaining && o.Remaining > o.Quota {
		w = append(w, fmt.Sprintf("%s: policy %s has r=%d above its quota q=%d; kept", field, quote(o.Policy), o.Remaining, o.Quota))
	}
	if !o.HasRemaining || !o.HasReset || o.Reset <= 0 || o.Remaining == 0 {
		return w
	}
	rate := float64(o.Remaining) / o.Reset.Seconds()
	if o.HasQuota && o.Window > 0 {
		if base := float64(o.Quota) / o.Window.Seconds(); rate > 10*base {
			w = append(w, fmt.Sprintf("%s: policy %s: r/t allows %.4g units/s, more than 10 times its q/w of %.4g; kept, not trusted", field, quote(o.Policy), rate, base))
		}
	} else if rate > 1000 {
		w = append(w, fmt.Sprintf("%s: policy %s: r/t allows %.4g units/s; kept, not trusted", field, quote(o.Policy), rate))
	}
	return w
}

// readDraft reads RateLimit-Policy and RateLimit (and, under Jira, their
// Beta- twins). A RateLimit that is not a List but the -07 Dictionary is
// read as draft-07.
func (rd *reader) readDraft() {
	rd.readDraftPair("RateLimit-Policy", "RateLimit", "")
	if rd.row().beta {
		rd.readDraftPair("Beta-RateLimit-Policy", "Beta-RateLimit", rd.p)
	}
}

// readDraftPair reads one pair of the draft's fields (policyField, such
// as RateLimit-Policy, and limitField, such as RateLimit), joining each
// limit to its policy; without a profile it also keeps the older drafts'
// forms of them (the policies of drafts -02 to -07, draft-07's limit fields).
func (rd *reader) readDraftPair(policyField, limitField string, profile Profile) {
	var ps []draftPolicy
	var legacy []legacyPolicy
	if lines := rd.lines(policyField); len(lines) > 0 {
		var warns []string
		ps, legacy, warns = parsePolicies(policyField, lines)
		rd.warnAll(warns)
	}
	if profile == "" {
		rd.legacy = legacy
	}
	var ls []draftLimit
	var draft07 []entry
	if lines := rd.lines(limitField); len(lines) > 0 {
		var warns []string
		var err error
		ls, warns, err = parseLimits(limitField, lines)
		if err != nil {
			var ok bool
			if profile == "" {
				draft07, ok = rd.readDraft07(lines)
			}
			if !ok {
				draft07 = nil
				rd.warnf("%s", err)
			}
		}
		rd.warnAll(warns)
	}
	for _, o := range joinDraft(ps, ls) {
		o.Profile = profile
		rd.warnAll(sanity(limitField, o))
		rd.add(o, false)
	}
	rd.entries = append(rd.entries, draft07...)
}

func (rd *reader) warnAll(ws []string) {
	for _, w := range ws {
		rd.warnf("%s", w)
	}
}
