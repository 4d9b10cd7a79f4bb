package ratelimit

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Scalar values that vendors put in headers: counts, delta seconds,
// epochs, durations and timestamps. Every parser here is strict about its
// grammar (quoted on each function), bounded in the length it looks at,
// and never returns a negative duration.

const (
	// maxScalarLen bounds a scalar field value (a count, a delay, a date).
	// Longer values are garbage: no parser here is run on them.
	maxScalarLen = 64

	// maxSeconds bounds every duration read from a header (about 31.7
	// years), which keeps time.Duration arithmetic far from overflow.
	// Longer durations are clamped to it, with a warning.
	maxSeconds = 1_000_000_000

	// plausibleEpoch is how far from the reference time an instant may lie
	// for a number of guessed meaning to be taken as an epoch.
	plausibleEpoch = 7 * 24 * time.Hour
)

// parseCount parses a non-negative decimal integer count:
//
//	count = 1*18DIGIT
//
// surrounded by optional whitespace. It reports false for anything else,
// including a sign, a fraction, or more than 18 digits.
func parseCount(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 18 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// isDecimal reports whether s matches
//
//	decimal = 1*DIGIT [ "." 1*DIGIT ]
//
// (no sign, no exponent, no "inf" or "nan"), at most maxScalarLen bytes.
func isDecimal(s string) bool {
	if s == "" || len(s) > maxScalarLen {
		return false
	}
	dot := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
		case c == '.' && !dot && i > 0 && i < len(s)-1:
			dot = true
		default:
			return false
		}
	}
	return true
}

// parseDecimal parses a non-negative decimal number (see isDecimal),
// surrounded by optional whitespace.
func parseDecimal(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	if !isDecimal(s) {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// seconds converts whole seconds to a duration, clamped to [0, maxSeconds].
// clamped reports whether the value was out of that range.
func seconds(n int64) (d time.Duration, clamped bool) {
	switch {
	case n < 0:
		return 0, true
	case n > maxSeconds:
		return maxSeconds * time.Second, true
	}
	return time.Duration(n) * time.Second, false
}

// floatSeconds converts fractional seconds to a duration rounded up to the
// millisecond, clamped to [0, maxSeconds].
func floatSeconds(f float64) (d time.Duration, clamped bool) {
	switch {
	case math.IsNaN(f) || f < 0:
		return 0, true
	case f > maxSeconds:
		return maxSeconds * time.Second, true
	}
	return time.Duration(math.Ceil(f*1000)) * time.Millisecond, false
}

// until returns t - ref, clamped to [0, maxSeconds]. past reports that t
// lies before ref.
func until(t, ref time.Time) (d time.Duration, past, clamped bool) {
	if t.Before(ref) {
		return 0, true, false
	}
	// Compare in seconds first: Sub saturates, but a saturated value is
	// still beyond the clamp.
	d = t.Sub(ref)
	if d > maxSeconds*time.Second {
		return maxSeconds * time.Second, false, true
	}
	return d, false, false
}

// epochTime returns the instant of an epoch in seconds (possibly
// fractional), or false when it is not a plausible Unix time (negative,
// or beyond the year 5000).
func epochTime(f float64) (time.Time, bool) {
	if math.IsNaN(f) || f < 0 || f > 95_617_584_000 {
		return time.Time{}, false
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(math.Round(frac*1e9))).UTC(), true
}

// A magnitude is what a bare number of unknown meaning probably is, judged
// by its size: below 1e9 a delta in seconds, 1e9 to 1e11 Unix seconds,
// 1e12 to 1e14 Unix milliseconds; anything else is unknown.
type magnitude int

const (
	magUnknown magnitude = iota
	magDelta
	magEpochSeconds
	magEpochMillis
)

func classify(f float64) magnitude {
	switch {
	case f < 0 || math.IsNaN(f):
		return magUnknown
	case f < 1e9:
		return magDelta
	case f < 1e11:
		return magEpochSeconds
	case f >= 1e12 && f < 1e14:
		return magEpochMillis
	}
	return magUnknown
}

// parseHTTPDate parses an HTTP-date (RFC 9110 §5.6.7):
//
//	HTTP-date    = IMF-fixdate / obs-date
//	obs-date     = rfc850-date / asctime-date
//
// in all three forms, case-sensitively, as net/http.ParseTime does.
func parseHTTPDate(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxScalarLen || !isLetter(s[0]) {
		// Every HTTP-date form begins with the day's name: a number is
		// not one, and failing three layouts to learn it is not free.
		return time.Time{}, false
	}
	t, err := http.ParseTime(s)
	return t, err == nil
}

// parseHTTPDateLenient parses an HTTP-date as parseHTTPDate does, and
// also one whose names are not in the grammar's case — day and month
// names are case-sensitive, "GMT" upper case (RFC 9110 §5.6.7) — as real
// servers send them ("mon, 01 jun 2026 12:01:00 gmt"). lenient reports
// that the date was read outside the grammar.
func parseHTTPDateLenient(s string) (t time.Time, lenient, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxScalarLen || !isLetter(s[0]) {
		return time.Time{}, false, false
	}
	c := canonicalDateCase(s)
	t, err := http.ParseTime(c)
	if err != nil {
		return time.Time{}, false, false
	}
	return t, c != s, true
}

// canonicalDateCase returns s with every run of letters in the case the
// HTTP-date grammar spells it: "GMT" upper case, day and month names with
// an initial capital.
func canonicalDateCase(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); {
		if !isLetter(b[i]) {
			i++
			continue
		}
		j := i
		for j < len(b) && isLetter(b[j]) {
			j++
		}
		word := strings.ToLower(string(b[i:j]))
		if word == "gmt" {
			copy(b[i:j], "GMT")
		} else {
			copy(b[i:j], strings.ToUpper(word[:1])+word[1:])
		}
		i = j
	}
	return string(b)
}

// parseTimestamp parses an RFC 3339 date-time, as Anthropic sends it:
//
//	date-time = full-date "T" full-time   ; e.g. 2026-05-23T12:01:00Z
//
// and, leniently, the minute-precision ISO 8601 form Jira sends
// (yyyy-MM-ddTHH:mmZ, e.g. 2026-03-26T16:00Z).
func parseTimestamp(s string) (time.Time, bool) {
	s = strings.TrimSpace(s)
	if len(s) < 5 || len(s) > maxScalarLen || !isDigits(s[:4]) || s[4] != '-' {
		// Both layouts begin with a four-digit year and a dash: a
		// number is not one, and failing two layouts to learn it is
		// not free.
		return time.Time{}, false
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// parseGoDuration parses the duration strings OpenAI sends, which are Go
// time.Duration strings, with an optional leading day count:
//
//	duration = [ 1*DIGIT "d" ] go-duration   ; e.g. 6m0s, 8.64s, 20ms, 1d2h
//
// Negative durations are rejected. ok is false for anything else.
func parseGoDuration(s string) (d time.Duration, ok bool) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > maxScalarLen || s[0] == '-' || s[0] == '+' {
		return 0, false
	}
	var days int64
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, ok := parseCount(s[:i])
		if !ok || n > maxSeconds/86400 {
			return 0, false
		}
		days, s = n, s[i+1:]
	}
	var rest time.Duration
	if s != "" {
		var err error
		rest, err = time.ParseDuration(s)
		if err != nil || rest < 0 {
			return 0, false
		}
	} else if days == 0 {
		return 0, false
	}
	total := time.Duration(days)*24*time.Hour + rest
	if total < 0 || total > maxSeconds*time.Second {
		return maxSeconds * time.Second, true
	}
	return total, true
}

// quote returns s quoted for a warning, shortened to a readable length so
// that a 64 KiB header never ends up in a log line.
func quote(s string) string {
	const max = 40
	if len(s) > max {
		return strconv.Quote(s[:max]) + "…"
	}
	return strconv.Quote(s)
}

func isLetter(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }

// isDigits reports whether s is all ASCII digits.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
