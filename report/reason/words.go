package reason

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// The actions advice takes, as the pacer and every surface name them.
const (
	Continue = "continue"
	SlowDown = "slow_down"
	Pause    = "pause"
)

// Advice says advice as one plain sentence a caller can act on, that
// agrees with its action: a pause says the wait it asks for (after,
// rounded up as retry-after is) and why; a slow_down says the spread
// calls should keep (why is WindowLow or UpstreamLow), or that calls in
// flight fill a policy (InFlightOf), or that why ends in under a second;
// a continue says what is left (CallsLeft, BytesLeft, InFlightOf) or
// that no limit binds (NoLimit).
func Advice(action string, after time.Duration, why Reason) string {
	switch {
	case action == Pause:
		return fmt.Sprintf("Wait %s before the next call: %s.", Duration(after), why)
	case action == SlowDown && why.Kind == WindowLow:
		return fmt.Sprintf("Only %d of %d calls %s left under policy '%s'; spread them out, %s.",
			why.Left, why.Limit, isAre(why.Left), why.Policy, pace(why.Spacing))
	case action == SlowDown && why.Kind == UpstreamLow:
		if why.Spacing <= 0 {
			return canMake(why.Left, why.For) + "." // no time to spread them over
		}
		return canMake(why.Left, why.For) + "; spread them out, " + pace(why.Spacing) + "."
	case action == SlowDown && why.Kind == InFlightOf:
		return Sentence(why.String() + "; a call made now waits until one of them ends")
	case action == SlowDown:
		return Sentence(why.String() + "; that ends in under a second, and a call made now waits for it")
	}
	return Sentence(why.String())
}

// Paused says that key's calls pause for after, and why: the error a
// refused call returns.
func Paused(key string, after time.Duration, why Reason) string {
	return fmt.Sprintf("key %s paused for %s: %s", key, Duration(after), why)
}

// Refused is the activity's record of a call refused locally.
func Refused(after time.Duration, why Reason) string {
	return fmt.Sprintf("refused locally, retry after %s: %s", Duration(after), why)
}

// Sentence capitalises s and ends it with a full stop.
func Sentence(s string) string {
	if s == "" {
		return s
	}
	if s[0] >= 'a' && s[0] <= 'z' {
		s = string(s[0]-'a'+'A') + s[1:]
	}
	if s[len(s)-1] != '.' {
		s += "."
	}
	return s
}

// Duration says d as a person would, never less than it is (the unit
// shown is rounded up): "under a second", "31 s", "119 s", "4 min",
// "1 h", "1 h 5 min". Every duration in advice and in a reason is said
// through it, so that a pause's words and its retry-after in whole
// seconds (rounded up too) agree: Duration of a whole number of seconds
// n is "n s" below 2 min, and less than a minute above n beyond. A zero
// or negative d is "0 s".
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0 s"
	case d < time.Second:
		return "under a second"
	}
	s := (d + time.Second - 1) / time.Second
	if s < 120 {
		return fmt.Sprintf("%d s", s)
	}
	m := (s + 59) / 60
	if m < 60 {
		return fmt.Sprintf("%d min", m)
	}
	if m%60 == 0 {
		return fmt.Sprintf("%d h", m/60)
	}
	return fmt.Sprintf("%d h %d min", m/60, m%60)
}

// Grouped writes n with a comma between each group of three digits:
// 1,000,000.
func Grouped(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3+1)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// pace says calls spread spacing apart: "about one every 4 s", or under
// a second "about 3 a second" (rounded down: never faster than it is).
func pace(spacing time.Duration) string {
	if spacing < time.Second {
		if spacing <= 0 {
			return "as they come"
		}
		if n := int(time.Second / spacing); n > 1 {
			return fmt.Sprintf("about %d a second", n)
		}
		return "about one a second"
	}
	return "about one every " + Duration(spacing)
}

// apart says how far apart calls go: "3 s apart", "less than a second
// apart".
func apart(spacing time.Duration) string {
	if spacing < time.Second {
		return "less than a second apart"
	}
	return Duration(spacing) + " apart"
}

// canMake says that n more calls can be made while a budget's reset
// holds: "You can make 12 more calls in the next 40 s", or "… now" when
// it holds for less than a second (a moment is no time to plan in).
func canMake(n int64, reset time.Duration) string {
	calls := fmt.Sprintf("%d more calls", n)
	if n == 1 {
		calls = "1 more call"
	}
	if reset < time.Second {
		return "You can make " + calls + " now"
	}
	return "You can make " + calls + " in the next " + Duration(reset)
}

// forNext says how long something holds: "for the next 18 s", "for
// under a second".
func forNext(d time.Duration) string {
	if d < time.Second {
		return "for " + Duration(d)
	}
	return "for the next " + Duration(d)
}

// howMany says n of unit u with its verb: "1 call is", "3 calls are",
// "0 content bytes are".
func howMany(n int64, u ratelimit.Unit) string {
	w := unitWord(u)
	if n == 1 {
		return "1 " + strings.TrimSuffix(w, "s") + " is"
	}
	return fmt.Sprintf("%d %s are", n, w)
}

// isAre is the verb for n things.
func isAre(n int64) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

func unitWord(u ratelimit.Unit) string {
	if u == "" || u == ratelimit.Requests {
		return "calls"
	}
	return strings.ReplaceAll(string(u), "-", " ")
}

// percent says a share as a person does: "40%".
func percent(share float64) string {
	return fmt.Sprintf("%g%%", math.Round(share*1000)/10)
}
