package reason

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// String says r as a clause: lowercase, without a full stop ("all 120
// calls per 60 s allowed by policy 'default' are used"). Sentence makes
// it a sentence.
func (r Reason) String() string {
	switch r.Kind {
	case Said:
		return r.Said
	case WindowSpent:
		s := fmt.Sprintf("all %d calls per %s allowed by policy '%s' are used", r.Limit, Duration(r.Window), r.Policy)
		if r.Held > 0 {
			s += fmt.Sprintf(" (%d of them are kept for other callers' reservations)", r.Held)
		}
		return s
	case WindowLow:
		return fmt.Sprintf("only %d of %d calls %s left under policy '%s', so calls are spread %s",
			r.Left, r.Limit, isAre(r.Left), r.Policy, apart(r.Spacing))
	case UpstreamLow:
		return fmt.Sprintf("the upstream says %s left %s under policy '%s', so calls are spread %s",
			howMany(r.Left, r.Unit), forNext(r.For), r.Policy, apart(r.Spacing))
	case UpstreamSpent:
		of := ""
		if r.Limit > 0 {
			of = fmt.Sprintf(" of %d", r.Limit)
		}
		return fmt.Sprintf("the upstream says 0%s %s are left under policy '%s' %s", of, unitWord(r.Unit), r.Policy, forNext(r.For))
	case UpstreamShort:
		return fmt.Sprintf("the upstream says %s left under policy '%s' %s, fewer than the %s %s the request carries",
			howMany(r.Left, r.Unit), r.Policy, forNext(r.For), Grouped(r.Carries), unitWord(r.Unit))
	case ProbeAsking:
		return "a probe is asking the upstream for a fresh answer and calls wait for it"
	case ProbeDue:
		return fmt.Sprintf("the upstream's last word on policy '%s' has expired, and one probe goes in %s to get a fresh one",
			r.Policy, Duration(r.For))
	case InFlight:
		return fmt.Sprintf("%d calls are in flight, the most allowed at once for this key", r.InFlight)
	case Spaced:
		return "calls are spaced " + apart(r.Spacing)
	case BytesNever:
		return fmt.Sprintf("the request carries %s content-bytes, more than the %s that policy '%s' allows in any %s: it can never go as it is; send a smaller body",
			Grouped(r.Carries), Grouped(r.Limit), r.Policy, Duration(r.Window))
	case BytesShort:
		return fmt.Sprintf("%s of %s content-bytes per %s are left under policy '%s', and the request carries %s",
			Grouped(r.Left), Grouped(r.Limit), Duration(r.Window), r.Policy, Grouped(max(r.Carries, 0)))
	case ConcurrencyFull:
		if r.Limit <= 0 {
			return fmt.Sprintf("%d concurrent requests are in flight, as many as the upstream's last answer allows under policy '%s', and the next starts when one of them ends",
				r.InFlight, r.Policy)
		}
		return fmt.Sprintf("all %s concurrent requests allowed by policy '%s' are in flight, and the next starts when one of them ends",
			Grouped(r.Limit), r.Policy)
	case ShareSpent:
		return fmt.Sprintf("principal '%s' has used its share of the key: %d of the %d calls per %s of policy '%s' (%s), "+
			"and it comes back as they leave the window; the key itself has %d left for the others",
			r.Principal, r.Used, r.Limit, Duration(r.Window), r.Policy, percent(r.Share), max(r.Left, 0))
	case Turn:
		return fmt.Sprintf("principals waiting for this key take turns by their shares, and principal '%s' (%d of this window's calls) "+
			"is further behind than principal '%s' (%d); the next of the %d calls left go to those further behind",
			r.Other, r.Behind, r.Principal, r.Used, r.Left)
	case BucketFull:
		return fmt.Sprintf("the upstream's bucket '%s' is full (%d calls) and leaks about %.3g calls a second, so the next call fits in %s",
			r.Policy, r.Limit, r.Rate, Duration(r.For))
	case RetryAfterAsked:
		return fmt.Sprintf("the upstream answered %d and asked to wait %s (Retry-After)", r.Status, Duration(r.For))
	case Abnormal:
		violated := ""
		if r.Violated != "" {
			violated = " (violated policies: [" + r.Violated + "])"
		}
		return fmt.Sprintf("the upstream reported abnormal usage of key '%s'%s; calls are paused until %s — check what is calling it before resuming",
			r.Key, violated, r.Until.UTC().Format(time.RFC3339))
	case CircuitOpen:
		return fmt.Sprintf("the circuit for key '%s' opened after %d refusals or failures without guidance, and one probe goes in %s",
			r.Key, r.Failures, Duration(r.For))
	case CircuitReopen:
		return fmt.Sprintf("the circuit for key '%s' opened again because its probe failed too, and the next probe goes in %s",
			r.Key, Duration(r.For))
	case BackOff:
		status := "nothing (the request failed)"
		if r.Status != 0 {
			status = strconv.Itoa(r.Status)
		}
		why := "without saying when to come back"
		if r.Short {
			why = fmt.Sprintf("and asked to wait only %s, too short to trust", Duration(r.For))
		}
		return fmt.Sprintf("the upstream answered %s %s, so calls back off (failure %d in a row)", status, why, r.Failures)
	case RouteBackOff:
		return fmt.Sprintf("the upstream answered %d to %s without a rate-limit signal, so calls on that route back off (failure %d on it within %s); other routes of the key go on",
			r.Status, r.Route, r.Failures, Duration(r.Window))
	case RouteCircuit:
		return fmt.Sprintf("the circuit for %s of key '%s' opened after failures without a rate-limit signal, for %s; other routes of the key go on",
			r.Route, r.Key, Duration(r.For))
	case HiddenLimit:
		return fmt.Sprintf("key '%s' hit a limit the upstream never announced ('%s'); it is now enforced locally as %d calls per %s",
			r.Key, r.Policy, r.Limit, Duration(r.Window))
	case HiddenStretched:
		return fmt.Sprintf("key '%s' was refused again by the limit the upstream never announced ('%s'); its window is longer than it seemed, and it is now enforced locally as %d calls per %s",
			r.Key, r.Policy, r.Limit, Duration(r.Window))
	case HiddenUnaccepted:
		return fmt.Sprintf("key '%s' was refused by a limit the upstream never announced ('%s') before any call of it was accepted; calls wait for the upstream's Retry-After or back off",
			r.Key, r.Policy)
	case WindowEdge:
		return fmt.Sprintf("key '%s' was refused by the upstream for a call sent as policy '%s' (%d calls per %s) freed a slot; it reached the upstream a moment before the upstream's own window freed it, and calls wait as the refusal asks",
			r.Key, r.Policy, r.Limit, Duration(r.Window))
	case PolicyBound:
		return fmt.Sprintf("the upstream of key '%s' announced more than mcp-quota keeps for one key (%d policies, %d route buckets); the least restrictive are dropped, and those that still bind are folded into policy '%s', at least as tight as each of them",
			r.Key, r.Limit, r.Buckets, r.Policy)
	case Late:
		return fmt.Sprintf("not sent: it would have left %s after its admission, later than the %s its window's margin allows; the call is admitted again",
			r.For.Round(time.Millisecond), r.Allowed.Round(time.Millisecond))
	case Answered:
		return fmt.Sprintf("HTTP %d %s", r.Status, http.StatusText(r.Status))
	case CallsLeft:
		return canMake(r.Left, r.For)
	case BytesLeft:
		s := fmt.Sprintf("%s of %s content-bytes are left under policy '%s'", Grouped(r.Left), Grouped(r.Limit), r.Policy)
		if r.For > 0 {
			s += " " + forNext(r.For)
		}
		return s
	case InFlightOf:
		if r.Limit <= 0 {
			return fmt.Sprintf("%d concurrent requests are in flight under policy '%s', and %d more may start", r.Used, r.Policy, max(r.Left, 0))
		}
		return fmt.Sprintf("%d of %s concurrent requests are in flight under policy '%s'", r.Used, Grouped(r.Limit), r.Policy)
	case NoLimit:
		return "no limit is known to bind this key right now; go ahead at a steady pace"
	case "":
		return ""
	}
	return string(r.Kind)
}

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
