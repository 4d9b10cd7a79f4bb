package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// maxGoogleDetails bounds the error details, and the quota violations of
// each, that are looked at.
const maxGoogleDetails = 16

// A googleStatus is the part of a google.rpc.Status error body
// (cloud.google.com/apis/design/errors) that reports rate limiting:
//
//	{"error": {"code": 429, "message": "…", "status": "RESOURCE_EXHAUSTED",
//	  "details": [
//	    {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
//	     "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
//	                     "quotaMetric": "…", "quotaValue": "15"}]},
//	    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "35s"}]}}
//
// Gemini's streaming endpoints wrap the object in an array of one; that
// is read too.
type googleStatus struct {
	status     string
	retry      wait // from RetryInfo.retryDelay
	violations []Observation
}

// googleStatus returns the body's google.rpc.Status, or nil when the body
// is not one: its "error" member is an object with a string "status" in
// the canonical codes' upper case, or with "details" typed
// type.googleapis.com/google.rpc.*.
func (rd *reader) googleStatus() *googleStatus {
	var e struct {
		Status  json.RawMessage
		Details []json.RawMessage
	}
	if !unmarshalStrict(rd.googleError(), &e) {
		return nil
	}
	g := &googleStatus{}
	_ = unmarshalStrict(e.Status, &g.status)
	typed := false
	for i, raw := range e.Details {
		if i == maxGoogleDetails {
			break
		}
		var d googleDetail
		if json.Unmarshal(raw, &d) != nil || !strings.HasPrefix(d.Type, googleTypes) {
			continue
		}
		typed = true
		g.add(d)
	}
	if !typed && !isCanonicalCode(g.status) {
		return nil
	}
	return g
}

// googleError is the body's "error" member, or the first element's of a
// body that is an array ([{"error": {…}}]); nil when there is none.
func (rd *reader) googleError() json.RawMessage {
	if rd.doc != nil {
		return rd.doc.raw("error")
	}
	b := bytes.TrimSpace(rd.body)
	if len(b) == 0 || b[0] != '[' {
		return nil
	}
	var arr []struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &arr) != nil || len(arr) == 0 {
		return nil
	}
	return arr[0].Error
}

// googleTypes begins the @type of every detail a google.rpc.Status holds.
const googleTypes = "type.googleapis.com/google.rpc."

// A googleDetail is one of a google.rpc.Status's details, of the two
// types that report rate limiting: RetryInfo and QuotaFailure.
type googleDetail struct {
	Type       string `json:"@type"`
	RetryDelay json.RawMessage
	Violations []googleViolation
}

// A googleViolation is one of a QuotaFailure's violations.
type googleViolation struct {
	Subject, QuotaID string
	QuotaValue       json.RawMessage
}

// add keeps what d says of the limit: a RetryInfo's delay, a
// QuotaFailure's violations (at most maxGoogleDetails of them).
func (g *googleStatus) add(d googleDetail) {
	switch strings.TrimPrefix(d.Type, googleTypes) {
	case "RetryInfo":
		var s string
		if !unmarshalStrict(d.RetryDelay, &s) {
			g.retry = wait{warn: "body RetryInfo.retryDelay: not a duration string, ignored"}
			return
		}
		g.retry = parseProtoDuration(s)
	case "QuotaFailure":
		for j, v := range d.Violations {
			if j == maxGoogleDetails {
				break
			}
			g.violations = append(g.violations, v.observation())
		}
	}
}

// observation is the violation as a policy: named by its quotaId (else
// its subject), with the quota its quotaValue gives and the window and
// unit its quotaId's name implies.
func (v googleViolation) observation() Observation {
	name := v.QuotaID
	if name == "" {
		name = v.Subject
	}
	if name == "" {
		name = "quota"
	}
	o := Observation{Policy: boundedText(name), Unit: quotaIDUnit(v.QuotaID), Shape: ShapeBody}
	if q, ok := googleInt(v.QuotaValue); ok {
		o.Quota, o.HasQuota = q, true
	}
	if w, ok := quotaIDWindow(v.QuotaID); ok {
		o.Window, o.Guessed = w, true
	}
	return o
}

// isCanonicalCode reports whether s looks like a google.rpc.Code name
// (RESOURCE_EXHAUSTED, UNAVAILABLE…).
func isCanonicalCode(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'A' || c > 'Z') && c != '_' {
			return false
		}
	}
	return true
}

// googleInt reads an int64 as proto3 JSON writes it: a string of digits,
// or a number.
func googleInt(raw json.RawMessage) (int64, bool) {
	var s string
	if unmarshalStrict(raw, &s) {
		return parseCount(s)
	}
	var n json.Number
	if unmarshalStrict(raw, &n) {
		i, err := n.Int64()
		return i, err == nil && i >= 0
	}
	return 0, false
}

// quotaIDWindow guesses a quota's window from the words of its ID, as
// Google names them (GenerateRequestsPerMinutePerProjectPerModel,
// …PerDay…).
func quotaIDWindow(id string) (time.Duration, bool) {
	for _, c := range []struct {
		word string
		w    time.Duration
	}{{"PerSecond", time.Second}, {"PerMinute", time.Minute}, {"PerHour", time.Hour}, {"PerDay", 24 * time.Hour}} {
		if strings.Contains(id, c.word) {
			return c.w, true
		}
	}
	return 0, false
}

// quotaIDUnit names what a quota counts by the words of its ID
// (GenerateContentInputTokensPerModelPerDay counts input tokens).
func quotaIDUnit(id string) Unit {
	switch {
	case strings.Contains(id, "InputTokens"):
		return InputTokens
	case strings.Contains(id, "OutputTokens"):
		return OutputTokens
	case strings.Contains(id, "Tokens"):
		return Tokens
	}
	return Requests
}

// parseProtoDuration parses a google.protobuf.Duration in its JSON form:
//
//	duration = ["-"] 1*DIGIT ["." 1*9DIGIT] "s"   ; e.g. 35s, 35.602077s
func parseProtoDuration(s string) wait {
	const name = "body RetryInfo.retryDelay"
	v := strings.TrimSpace(s)
	n, ok := strings.CutSuffix(v, "s")
	f, okF := parseDecimal(n)
	if !ok || !okF || len(v) > maxScalarLen {
		return wait{warn: fmt.Sprintf("%s: not a duration %s, ignored", name, quote(s))}
	}
	d, _ := floatSeconds(f)
	return capWait(d, name, v)
}

// readGoogleStatus reads a google.rpc.Status error body, under every
// profile since many APIs front Google's: RetryInfo's retryDelay is the
// server's wait. Its QuotaFailure is read later, with the other
// violated policies (readGoogleQuota).
func (rd *reader) readGoogleStatus() {
	if rd.resp.Status < 400 {
		return
	}
	g := rd.googleStatus()
	if g == nil {
		return
	}
	rd.google = g
	if g.retry.ok || g.retry.warn != "" {
		rd.applyWait(g.retry)
	}
}

// readGoogleQuota records the quotas a google.rpc.Status names violated as
// exhausted, as problem details' violated-policies are (see violated),
// with the quota value and, guessed from the quota's ID, the window; a
// RESOURCE_EXHAUSTED status marks the reading Throttled.
func (rd *reader) readGoogleQuota() {
	g := rd.google
	if g == nil {
		return
	}
	if g.status == "RESOURCE_EXHAUSTED" {
		rd.r.Throttled = true
	}
	for _, o := range g.violations {
		if o.Guessed {
			rd.warnf("body QuotaFailure: quota %s read as a window of %v (guessed from its name)", quote(o.Policy), o.Window)
		}
		rd.violatedAs(o)
	}
}
