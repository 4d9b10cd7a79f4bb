package ratelimit

import (
	"math"
	"strconv"
	"strings"
	"time"
)

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
