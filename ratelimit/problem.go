package ratelimit

import (
	"bytes"
	"mime"
	"strings"
)

// readProblem reads RFC 9457 problem details, when the body is one: its
// Content-Type is application/problem+json, or the status is 400 or more
// and the body is a JSON object that looks like one (an integer "status",
// or a string "type" together with another problem member). The members
// read are:
//
//	type, title, detail, code : string
//	status                    : integer
//	violated-policies         : array of strings
//
// A member of the wrong type is ignored (RFC 9457 §3.1), with a warning;
// a body that is not valid JSON is ignored, with a warning, and the
// headers are still read (draft-11 Appendix B.1.4 has an invalid example).
//
// On a status of 400 or more, the draft's problem types, the seed API's
// code "rateLimited", and a problem status 429 mark the response
// Throttled; abnormal-usage-detected also marks it Abnormal. The policies
// named in violated-policies are recorded as exhausted: an observation of
// that name gets Remaining 0 (with a warning if it said more), and a
// policy no field described gets an observation of its own (ShapeProblem).
func (rd *reader) readProblem() {
	declared := isProblemType(rd.h.Get("Content-Type"))
	if !declared && (rd.resp.Status < 400 || rd.doc == nil || !looksLikeProblem(rd.doc)) {
		return
	}
	if rd.doc == nil {
		if len(bytes.TrimSpace(rd.body)) > 0 {
			rd.warnf("problem details: body is not a complete JSON object, ignored")
		}
		return
	}
	p := &Problem{}
	str := func(name string, dst *string) {
		if !rd.doc.has(name) {
			return
		}
		if !rd.doc.member(name, dst) {
			rd.warnf("problem details: member %q is not a string, ignored", name)
		}
	}
	str("type", &p.Type)
	str("title", &p.Title)
	str("detail", &p.Detail)
	str("code", &p.Code)
	if rd.doc.has("status") {
		if i, ok := rd.doc.integer("status"); ok && i >= 100 && i <= 999 {
			p.Status = int(i)
		} else {
			rd.warnf("problem details: member \"status\" is not an HTTP status code, ignored")
		}
	}
	if rd.doc.has("violated-policies") {
		if !rd.doc.member("violated-policies", &p.ViolatedPolicies) {
			p.ViolatedPolicies = nil
			rd.warnf("problem details: member \"violated-policies\" is not an array of strings, ignored")
		}
	}
	rd.r.Problem = p

	if rd.resp.Status < 400 {
		return
	}
	switch p.Type {
	case ProblemQuotaExceeded, ProblemTemporaryReducedCapacity:
		rd.r.Throttled = true
	case ProblemAbnormalUsage:
		rd.r.Throttled = true
		rd.r.Abnormal = true
		rd.warnf("upstream reported abnormal usage: pause and check the caller, do not retry in a loop")
	}
	if p.Code == "rateLimited" || p.Status == 429 {
		rd.r.Throttled = true
	}
	for _, name := range p.ViolatedPolicies {
		rd.violated(name)
	}
}

// violated records that the policy name is exhausted.
func (rd *reader) violated(name string) {
	found := false
	for i := range rd.entries {
		e := &rd.entries[i]
		if e.Policy != name || e.Shape == ShapeProblem {
			continue
		}
		found = true
		if e.HasRemaining && e.Remaining > 0 {
			rd.warnf("problem details: policy %s is violated but RateLimit said r=%d; read as 0", quote(name), e.Remaining)
		}
		e.Remaining, e.HasRemaining = 0, true
	}
	if !found {
		rd.add(Observation{Policy: name, Remaining: 0, HasRemaining: true, Shape: ShapeProblem}, false)
	}
}

// isProblemType reports whether a Content-Type is application/problem+json.
func isProblemType(ct string) bool {
	if ct == "" || len(ct) > maxFieldLen {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && strings.EqualFold(mt, "application/problem+json")
}

// looksLikeProblem reports whether a JSON object served without the
// problem media type is problem details nonetheless. Vendor error bodies
// that merely have a "type" member ({"type":"error","error":{…}}) do not.
func looksLikeProblem(d *bodyDoc) bool {
	if _, ok := d.integer("status"); ok {
		return true
	}
	if _, ok := d.str("type"); !ok {
		return false
	}
	for _, m := range []string{"title", "detail", "code", "violated-policies", "instance"} {
		if d.has(m) {
			return true
		}
	}
	return false
}
