package ratelimit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
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
	raw := rd.doc.raw("error")
	if rd.doc == nil {
		// [{"error": {…}}]
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
		raw = arr[0].Error
	}
	var e struct {
		Status  json.RawMessage
		Details []json.RawMessage
	}
	if !unmarshalStrict(raw, &e) {
		return nil
	}
	g := &googleStatus{}
	_ = unmarshalStrict(e.Status, &g.status)
	typed := false
	for i, raw := range e.Details {
		if i == maxGoogleDetails {
			break
		}
		var d struct {
			Type       string `json:"@type"`
			RetryDelay json.RawMessage
			Violations []struct {
				Subject, QuotaID string
				QuotaValue       json.RawMessage
			}
		}
		if json.Unmarshal(raw, &d) != nil || !strings.HasPrefix(d.Type, "type.googleapis.com/google.rpc.") {
			continue
		}
		typed = true
		switch strings.TrimPrefix(d.Type, "type.googleapis.com/google.rpc.") {
		case "RetryInfo":
			var s string
			if !unmarshalStrict(d.RetryDelay, &s) {
				g.retry = wait{warn: "body RetryInfo.retryDelay: not a duration string, ignored"}
				continue
			}
			g.retry = parseProtoDuration(s)
		case "QuotaFailure":
			for j, v := range d.Violations {
				if j == maxGoogleDetails {
					break
				}
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
				g.violations = append(g.violations, o)
			}
		}
	}
	if !typed && !isCanonicalCode(g.status) {
		return nil
	}
	return g
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

// maxHintText bounds how much of an error message is searched for a
// prose hint.
const maxHintText = 4 << 10

// hintPhrases introduce a wait in the prose of error messages: OpenAI's
// "Please try again in 634ms", Azure's "Please retry after 33 seconds",
// Gemini's "Please retry in 35.60207746s".
var hintPhrases = []string{"try again in ", "retry in ", "retry after "}

// readProseHint reads a wait written in the prose of an error body's
// message (members message, detail, error, error.message), under every
// profile, on a status of 400 or more. It is a hint, not a field: it is
// kept only when no field set a longer wait, and it is flagged
// (RetryAfterHint) and warned.
func (rd *reader) readProseHint() {
	if rd.resp.Status < 400 || rd.doc == nil {
		return
	}
	var texts []string
	for _, m := range []string{"message", "detail", "error"} {
		if s, ok := rd.doc.str(m); ok {
			texts = append(texts, s)
		}
	}
	var inner struct{ Message string }
	if unmarshalStrict(rd.doc.raw("error"), &inner) && inner.Message != "" {
		texts = append(texts, inner.Message)
	}
	best, found, phrase := time.Duration(0), false, ""
	for _, t := range texts {
		if d, p, ok := parseProseWait(t); ok && (!found || d > best) {
			best, found, phrase = d, true, p
		}
	}
	if !found {
		return
	}
	if rd.r.HasRetryAfter && best <= rd.r.RetryAfter {
		return // a field's wait at least as long: the hint adds nothing
	}
	rd.r.RetryAfter, rd.r.HasRetryAfter, rd.r.RetryAfterHint = best, true, true
	rd.warnf("body message: %s read as a hint: wait %v", quote(phrase), best)
}

// parseProseWait finds the longest wait a message's prose names after one
// of hintPhrases, ignoring case:
//
//	hint  = phrase ( go-duration / number *" " unit )
//	unit  = "ms" / "millisecond(s)" / "s" / "sec(s)" / "second(s)" / "min(s)" / "minute(s)" / "h" / "hour(s)"
//
// go-duration is a Go duration string such as 634ms, 2.196s or 1m30s.
// phrase is the matched text, for the warning.
func parseProseWait(text string) (d time.Duration, phrase string, ok bool) {
	if len(text) > maxHintText {
		text = text[:maxHintText]
	}
	lower := asciiLower(text) // byte for byte, so that its offsets are text's
	for _, p := range hintPhrases {
		for i := 0; i < len(lower); {
			j := strings.Index(lower[i:], p)
			if j < 0 {
				break
			}
			start := i + j
			rest := lower[start+len(p):]
			i = start + len(p)
			w, n, okW := proseDuration(rest)
			if okW && (!ok || w > d) {
				d, ok, phrase = w, true, text[start:start+len(p)+n]
			}
		}
	}
	return d, phrase, ok
}

// proseDuration reads the duration at the start of s (lower case),
// returning it and how many bytes it took.
func proseDuration(s string) (time.Duration, int, bool) {
	n := 0
	for n < len(s) && n < 32 && (s[n] >= '0' && s[n] <= '9' || s[n] == '.' || s[n] >= 'a' && s[n] <= 'z') {
		n++
	}
	tok := strings.TrimRight(s[:n], ".")
	if tok == "" || tok[0] < '0' || tok[0] > '9' {
		return 0, 0, false
	}
	if d, ok := parseGoDuration(tok); ok {
		return min(d, MaxRetryAfter), len(tok), true
	}
	// number, spaces, unit word: "33 seconds"
	f, err := strconv.ParseFloat(tok, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) {
		return 0, 0, false
	}
	m := n
	for m < len(s) && s[m] == ' ' {
		m++
	}
	u := m
	for u < len(s) && s[u] >= 'a' && s[u] <= 'z' {
		u++
	}
	var unit time.Duration
	switch s[m:u] {
	case "ms", "millisecond", "milliseconds":
		unit = time.Millisecond
	case "s", "sec", "secs", "second", "seconds":
		unit = time.Second
	case "min", "mins", "minute", "minutes":
		unit = time.Minute
	case "h", "hour", "hours":
		unit = time.Hour
	default:
		return 0, 0, false
	}
	d, clamped := floatSeconds(f * unit.Seconds())
	if clamped || d > MaxRetryAfter {
		d = MaxRetryAfter
	}
	return d, u, true
}

// asciiLower lowers the ASCII letters of s and keeps every other byte, so
// that the result has s's length (strings.ToLower may not, on invalid
// UTF-8).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
