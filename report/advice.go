package report

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// Paused is the advice for a call the pacer refused (nothing was sent):
// come back after the refusal's wait, in whole seconds — or, when that is
// within maxWait (the most a fetch's max_wait_s may ask), let the call
// itself wait, the one way an agent without a sleep tool can wait.
func Paused(key string, pe *pacer.PauseError, maxWait time.Duration) Advice {
	secs := max(Seconds(pe.RetryAfter), 1)
	wait := time.Duration(secs) * time.Second
	say := fmt.Sprintf("Paused: key '%s': %s; nothing was sent. Call again after %s", key, pe.Reason, reason.Duration(wait))
	if wait <= maxWait {
		say += fmt.Sprintf(", or call again now with max_wait_s: %d and the call waits for its turn itself.", secs)
	} else {
		say += fmt.Sprintf("; max_wait_s cannot wait that long (%s at most), so do other work first.", reason.Duration(maxWait))
	}
	return Advice{Action: string(pacer.Pause), RetryAfterS: secs, Reason: say}
}

// WaitInstead adds to a pause that a fetch whose max_wait_s covers it
// waits for its turn itself, when maxWait (the most max_wait_s may ask)
// allows it. Other advice is returned as it is.
func WaitInstead(a Advice, maxWait time.Duration) Advice {
	if a.Action != string(pacer.Pause) || secs(a.RetryAfterS) > maxWait || strings.Contains(a.Reason, "max_wait_s") {
		return a
	}
	a.Reason += fmt.Sprintf(" Or call fetch with max_wait_s: %d, and the call waits for its turn itself.", a.RetryAfterS)
	return a
}

var (
	// said matches a duration as pacer.FormatDuration says it, and the
	// forms it never uses (milliseconds, fractions).
	said = regexp.MustCompile(`\b(under a second|\d+(?:\.\d+)? ?(?:ms|s|min|h)(?: \d+ min)?)\b`)
	// waitFor is where a pause says how long: "Wait 18 s before…" (at
	// the start of a sentence), "Call again after 18 s".
	waitFor = regexp.MustCompile(`(?:\bWait|Call again after) (under a second|\d+ (?:s|min|h)(?: \d+ min)?)\b`)
	// canMake is what continue says is left.
	canMake = regexp.MustCompile(`You can make (\d+) more calls?(?: in the next (\d+ (?:s|min|h)(?: \d+ min)?))?`)
	// spent is a reason saying that a budget has nothing left.
	spent = regexp.MustCompile(`are used|says 0 (?:of \d+ )?\w+ are left`)
)

// Check reports how a, given with the quota q of the same answer, breaks
// the rules every advice keeps, or nil when it keeps them:
//
//   - the action is continue, slow_down or pause, and pause comes with a
//     retry_after_s of at least 1, the others with 0;
//   - a pause says how long to wait, and that is retry_after_s as
//     FormatDuration says it (never less, less than one unit more);
//   - a reason that says a budget is spent is a pause, or a slow_down
//     whose wait ends in under a second; continue never says it;
//   - what continue says is left is the quota's remaining, for its reset;
//   - every duration reads as FormatDuration says it ("31 s", "4 min",
//     "1 h 5 min", "under a second"; never "0 s", milliseconds or
//     fractions);
//   - reset_s never exceeds window_s.
func (a Advice) Check(q Quota) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch pacer.Action(a.Action) {
	case pacer.Pause:
		if a.RetryAfterS < 1 {
			bad("pause with retry_after_s %d", a.RetryAfterS)
		}
		m := waitFor.FindStringSubmatch(a.Reason)
		if m == nil {
			bad("pause does not say how long to wait")
		} else if d, unit, ok := parseSaid(m[1]); !ok || d < secs(a.RetryAfterS) || d >= secs(a.RetryAfterS)+unit {
			bad("pause says %q, retry_after_s is %d", m[1], a.RetryAfterS)
		}
	case pacer.SlowDown, pacer.Continue:
		if a.RetryAfterS != 0 {
			bad("%s with retry_after_s %d", a.Action, a.RetryAfterS)
		}
		if waitFor.MatchString(a.Reason) {
			bad("%s tells the caller to wait", a.Action)
		}
		if spent.MatchString(a.Reason) && (a.Action == string(pacer.Continue) || !strings.Contains(a.Reason, "under a second")) {
			bad("%s says a budget is spent", a.Action)
		}
	default:
		bad("unknown action %q", a.Action)
	}
	if m := canMake.FindStringSubmatch(a.Reason); m != nil && a.Action == string(pacer.Continue) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		if n <= 0 || (q.Remaining >= 0 && n != q.Remaining) {
			bad("continue says %d more calls, the quota %d", n, q.Remaining)
		}
		reset := q.ResetS
		if reset == 0 {
			reset = q.WindowS
		}
		if m[2] != "" {
			if d, unit, ok := parseSaid(m[2]); !ok || d < secs(reset) || d >= secs(reset)+unit {
				bad("continue says %q, the quota's reset is %d s", m[2], reset)
			}
		}
	}
	for _, s := range said.FindAllString(a.Reason, -1) {
		if _, _, ok := parseSaid(s); !ok {
			bad("%q is not a duration as a person says it", s)
		}
	}
	if q.WindowS > 0 && q.ResetS > q.WindowS {
		bad("reset_s %d exceeds window_s %d", q.ResetS, q.WindowS)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("advice %s %d %q: %w", a.Action, a.RetryAfterS, a.Reason, err)
	}
	return nil
}

func secs(n int64) time.Duration { return time.Duration(n) * time.Second }

// parseSaid reads a duration as pacer.FormatDuration says it, with the
// unit it was rounded up to; ok is false for any other form.
func parseSaid(s string) (d, unit time.Duration, ok bool) {
	if s == "under a second" {
		return 0, time.Second, true
	}
	var n, m int64
	switch {
	case scan(s, "%d s", &n) && n >= 1 && n < 120:
		return secs(n), time.Second, true
	case scan(s, "%d min", &n) && n >= 2 && n < 60:
		return time.Duration(n) * time.Minute, time.Minute, true
	case scan(s, "%d h %d min", &n, &m) && n >= 1 && m >= 1 && m < 60:
		return time.Duration(n)*time.Hour + time.Duration(m)*time.Minute, time.Minute, true
	case scan(s, "%d h", &n) && n >= 1:
		return time.Duration(n) * time.Hour, time.Minute, true
	}
	return 0, 0, false
}

// scan is fmt.Sscanf that must consume all of s in format.
func scan(s, format string, args ...any) bool {
	n, err := fmt.Sscanf(s, format, args...)
	return err == nil && n == len(args) && fmt.Sprintf(format, deref(args)...) == s
}

func deref(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = *a.(*int64)
	}
	return out
}
