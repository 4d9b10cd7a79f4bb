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
// On a status of 400 or more, the draft's problem types, the reference API's
// code "rateLimited", and a problem status 429 mark the response
// Throttled; abnormal-usage-detected also marks it Abnormal. The policies
// named in violated-policies are recorded as exhausted: an observation of
// that name gets Remaining 0 (with a warning if it said more), and a
// policy no field described gets an observation of its own (ShapeProblem);
// the answer's own wait, when it has one, is how long they stay so (see
// violatedAs).
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
	rd.violatedAs(Observation{Policy: name, Shape: ShapeProblem})
}

// violatedAs records that the policy o names is exhausted: every
// observation of that name (from another shape) gets Remaining 0, with a
// warning if it said more; when there is none, o itself is added, with
// Remaining 0.
//
// When the answer carries its own wait (Retry-After, RetryInfo…), that
// wait is how long the policy stays exhausted: the server said when to
// come back, and the policy's window (an hour, say) only shapes the pace
// after it. The one exception is a policy whose own r=0 and t in the same
// answer prove a longer wait: that t is kept.
func (rd *reader) violatedAs(o Observation) {
	found := false
	for i := range rd.entries {
		e := &rd.entries[i]
		if e.Policy != o.Policy || e.Shape == o.Shape {
			continue
		}
		found = true
		proved := e.HasRemaining && e.Remaining == 0 && e.HasReset
		if e.HasRemaining && e.Remaining > 0 {
			rd.warnf("problem details: policy %s is violated but RateLimit said r=%d; read as 0", quote(o.Policy), e.Remaining)
		}
		e.Remaining, e.HasRemaining = 0, true
		rd.ownWait(&e.Observation, proved)
	}
	if !found {
		o.Remaining, o.HasRemaining = 0, true
		rd.ownWait(&o, false)
		rd.add(o, false)
	}
}

// ownWait makes the answer's own wait the effective window of a policy it
// names violated, unless proved (see violatedAs).
func (rd *reader) ownWait(o *Observation, proved bool) {
	if rd.r.HasRetryAfter && !proved {
		if o.HasReset && o.Reset > rd.r.RetryAfter {
			rd.warnf("policy %s is violated: the answer's own wait of %v wins over its t of %v", quote(o.Policy), rd.r.RetryAfter, o.Reset)
		}
		o.Reset, o.HasReset = rd.r.RetryAfter, true
	}
}

// isProblemType reports whether a Content-Type is application/problem+json.
func isProblemType(ct string) bool {
	if ct == "" || len(ct) > maxFieldLen {
		return false
	}
	if base, _, _ := strings.Cut(ct, ";"); !strings.EqualFold(strings.TrimSpace(base), "application/problem+json") {
		return false // most answers' type, told without parsing it
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
