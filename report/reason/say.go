package reason

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// String says r as a clause: lowercase, without a full stop ("all 120
// calls per 60 s allowed by policy 'default' are used"). Sentence makes
// it a sentence. A Said reason is its words as kept; a kind String does
// not know is its name.
func (r Reason) String() string {
	switch r.Kind {
	case "":
		return ""
	case Said:
		return r.Said
	}
	if say, ok := words[r.Kind]; ok {
		return say(r)
	}
	return string(r.Kind)
}

// words says a Reason of each kind, by its kind (Said and the zero Reason
// aside).
var words = map[Kind]func(Reason) string{
	WindowSpent:      sayWindowSpent,
	WindowLow:        sayWindowLow,
	UpstreamLow:      sayUpstreamLow,
	UpstreamSpent:    sayUpstreamSpent,
	UpstreamShort:    sayUpstreamShort,
	ProbeAsking:      sayProbeAsking,
	ProbeDue:         sayProbeDue,
	InFlight:         sayInFlight,
	Spaced:           saySpaced,
	BytesNever:       sayBytesNever,
	BytesShort:       sayBytesShort,
	ConcurrencyFull:  sayConcurrencyFull,
	ShareSpent:       sayShareSpent,
	Turn:             sayTurn,
	BucketFull:       sayBucketFull,
	RetryAfterAsked:  sayRetryAfterAsked,
	Abnormal:         sayAbnormal,
	CircuitOpen:      sayCircuitOpen,
	CircuitReopen:    sayCircuitReopen,
	BackOff:          sayBackOff,
	RouteBackOff:     sayRouteBackOff,
	RouteCircuit:     sayRouteCircuit,
	HiddenLimit:      sayHiddenLimit,
	HiddenStretched:  sayHiddenStretched,
	HiddenUnaccepted: sayHiddenUnaccepted,
	WindowEdge:       sayWindowEdge,
	PolicyBound:      sayPolicyBound,
	Late:             sayLate,
	Answered:         sayAnswered,
	RefusedLocal:     sayRefusedLocal,
	Failed:           sayFailed,
	Interrupted:      sayInterrupted,
	Unreported:       sayUnreported,
	Unneeded:         sayUnneeded,
	Reserved:         sayReserved,
	KeptPage:         sayKeptPage,
	LoopGuard:        sayLoopGuard,
	CallsLeft:        sayCallsLeft,
	BytesLeft:        sayBytesLeft,
	InFlightOf:       sayInFlightOf,
	NoLimit:          sayNoLimit,
}

func sayWindowSpent(r Reason) string {
	s := fmt.Sprintf("all %d calls per %s allowed by policy '%s' are used", r.Limit, Duration(r.Window), r.Policy)
	if r.Held > 0 {
		s += fmt.Sprintf(" (%d of them are kept for other callers' reservations)", r.Held)
	}
	return s
}

func sayWindowLow(r Reason) string {
	return fmt.Sprintf("only %d of %d calls %s left under policy '%s', so calls are spread %s",
		r.Left, r.Limit, isAre(r.Left), r.Policy, apart(r.Spacing))
}

func sayUpstreamLow(r Reason) string {
	return fmt.Sprintf("the upstream says %s left %s under policy '%s', so calls are spread %s",
		howMany(r.Left, r.Unit), forNext(r.For), r.Policy, apart(r.Spacing))
}

func sayUpstreamSpent(r Reason) string {
	of := ""
	if r.Limit > 0 {
		of = fmt.Sprintf(" of %d", r.Limit)
	}
	return fmt.Sprintf("the upstream says 0%s %s are left under policy '%s' %s", of, unitWord(r.Unit), r.Policy, forNext(r.For))
}

func sayUpstreamShort(r Reason) string {
	return fmt.Sprintf("the upstream says %s left under policy '%s' %s, fewer than the %s %s the request carries",
		howMany(r.Left, r.Unit), r.Policy, forNext(r.For), Grouped(r.Carries), unitWord(r.Unit))
}

func sayProbeAsking(r Reason) string {
	return "a probe is asking the upstream for a fresh answer and calls wait for it"
}

func sayProbeDue(r Reason) string {
	return fmt.Sprintf("the upstream's last word on policy '%s' has expired, and one probe goes in %s to get a fresh one",
		r.Policy, Duration(r.For))
}

func sayInFlight(r Reason) string {
	return fmt.Sprintf("%d calls are in flight, the most allowed at once for this key", r.InFlight)
}

func saySpaced(r Reason) string {
	return "calls are spaced " + apart(r.Spacing)
}

func sayBytesNever(r Reason) string {
	return fmt.Sprintf("the request carries %s content-bytes, more than the %s that policy '%s' allows in any %s: it can never go as it is; send a smaller body",
		Grouped(r.Carries), Grouped(r.Limit), r.Policy, Duration(r.Window))
}

func sayBytesShort(r Reason) string {
	return fmt.Sprintf("%s of %s content-bytes per %s are left under policy '%s', and the request carries %s",
		Grouped(r.Left), Grouped(r.Limit), Duration(r.Window), r.Policy, Grouped(max(r.Carries, 0)))
}

func sayConcurrencyFull(r Reason) string {
	if r.Limit <= 0 {
		return fmt.Sprintf("%d concurrent requests are in flight, as many as the upstream's last answer allows under policy '%s', and the next starts when one of them ends",
			r.InFlight, r.Policy)
	}
	return fmt.Sprintf("all %s concurrent requests allowed by policy '%s' are in flight, and the next starts when one of them ends",
		Grouped(r.Limit), r.Policy)
}

func sayShareSpent(r Reason) string {
	return fmt.Sprintf("principal '%s' has used its share of the key: %d of the %d calls per %s of policy '%s' (%s), "+
		"and it comes back as they leave the window; the key itself has %d left for the others",
		r.Principal, r.Used, r.Limit, Duration(r.Window), r.Policy, percent(r.Share), max(r.Left, 0))
}

func sayTurn(r Reason) string {
	return fmt.Sprintf("principals waiting for this key take turns by their shares, and principal '%s' (%d of this window's calls) "+
		"is further behind than principal '%s' (%d); the next of the %d calls left go to those further behind",
		r.Other, r.Behind, r.Principal, r.Used, r.Left)
}

func sayBucketFull(r Reason) string {
	return fmt.Sprintf("the upstream's bucket '%s' is full (%d calls) and leaks about %.3g calls a second, so the next call fits in %s",
		r.Policy, r.Limit, r.Rate, Duration(r.For))
}

func sayRetryAfterAsked(r Reason) string {
	return fmt.Sprintf("the upstream answered %d and asked to wait %s (Retry-After)", r.Status, Duration(r.For))
}

func sayAbnormal(r Reason) string {
	violated := ""
	if r.Violated != "" {
		violated = " (violated policies: [" + r.Violated + "])"
	}
	return fmt.Sprintf("the upstream reported abnormal usage of key '%s'%s; calls are paused until %s — check what is calling it before resuming",
		r.Key, violated, r.Until.UTC().Format(time.RFC3339))
}

func sayCircuitOpen(r Reason) string {
	return fmt.Sprintf("the circuit for key '%s' opened after %d refusals or failures without guidance, and one probe goes in %s",
		r.Key, r.Failures, Duration(r.For))
}

func sayCircuitReopen(r Reason) string {
	return fmt.Sprintf("the circuit for key '%s' opened again because its probe failed too, and the next probe goes in %s",
		r.Key, Duration(r.For))
}

func sayBackOff(r Reason) string {
	status := "nothing (the request failed)"
	if r.Status != 0 {
		status = strconv.Itoa(r.Status)
	}
	why := "without saying when to come back"
	if r.Short {
		why = fmt.Sprintf("and asked to wait only %s, too short to trust", Duration(r.For))
	}
	return fmt.Sprintf("the upstream answered %s %s, so calls back off (failure %d in a row)", status, why, r.Failures)
}

func sayRouteBackOff(r Reason) string {
	return fmt.Sprintf("the upstream answered %d to %s without a rate-limit signal, so calls on that route back off (failure %d on it within %s); other routes of the key go on",
		r.Status, r.Route, r.Failures, Duration(r.Window))
}

func sayRouteCircuit(r Reason) string {
	return fmt.Sprintf("the circuit for %s of key '%s' opened after failures without a rate-limit signal, for %s; other routes of the key go on",
		r.Route, r.Key, Duration(r.For))
}

func sayHiddenLimit(r Reason) string {
	return fmt.Sprintf("key '%s' hit a limit the upstream never announced ('%s'); it is now enforced locally as %d calls per %s",
		r.Key, r.Policy, r.Limit, Duration(r.Window))
}

func sayHiddenStretched(r Reason) string {
	return fmt.Sprintf("key '%s' was refused again by the limit the upstream never announced ('%s'); its window is longer than it seemed, and it is now enforced locally as %d calls per %s",
		r.Key, r.Policy, r.Limit, Duration(r.Window))
}

func sayHiddenUnaccepted(r Reason) string {
	return fmt.Sprintf("key '%s' was refused by a limit the upstream never announced ('%s') before any call of it was accepted; calls wait for the upstream's Retry-After or back off",
		r.Key, r.Policy)
}

func sayWindowEdge(r Reason) string {
	return fmt.Sprintf("key '%s' was refused by the upstream for a call sent as policy '%s' (%d calls per %s) freed a slot; it reached the upstream a moment before the upstream's own window freed it, and calls wait as the refusal asks",
		r.Key, r.Policy, r.Limit, Duration(r.Window))
}

func sayPolicyBound(r Reason) string {
	return fmt.Sprintf("the upstream of key '%s' announced more than mcp-quota keeps for one key (%d policies, %d route buckets); the least restrictive are dropped, and those that still bind are folded into policy '%s', at least as tight as each of them",
		r.Key, r.Limit, r.Buckets, r.Policy)
}

func sayLate(r Reason) string {
	return fmt.Sprintf("not sent: it would have left %s after its admission, later than the %s its window's margin allows; the call is admitted again",
		r.For.Round(time.Millisecond), r.Allowed.Round(time.Millisecond))
}

func sayAnswered(r Reason) string {
	return fmt.Sprintf("HTTP %d %s", r.Status, http.StatusText(r.Status))
}

// sayRefusedLocal says the refusal and the reason it was refused for.
func sayRefusedLocal(r Reason) string {
	why := r
	why.Kind, why.Because, why.RetryAfter = r.Because, "", 0
	return Refused(r.RetryAfter, why)
}

func sayFailed(r Reason) string { return r.Error }

func sayInterrupted(Reason) string {
	return "the process handling it ended before an answer was recorded"
}

func sayUnreported(Reason) string {
	return "reserved by a process that ended before reporting it: counted as sent, whether or not it was"
}

func sayReserved(Reason) string {
	return "reserved for a batch of calls of one process, taken without a transaction each"
}

func sayUnneeded(Reason) string {
	return "reserved for a batch of calls and not needed; counted, since later admissions follow it"
}

func sayKeptPage(r Reason) string {
	return "page read from the answer kept " + Duration(r.For) + " ago"
}

func sayLoopGuard(Reason) string { return "loop guard: identical request, unchanged answer" }

func sayCallsLeft(r Reason) string {
	return canMake(r.Left, r.For)
}

func sayBytesLeft(r Reason) string {
	s := fmt.Sprintf("%s of %s content-bytes are left under policy '%s'", Grouped(r.Left), Grouped(r.Limit), r.Policy)
	if r.For > 0 {
		s += " " + forNext(r.For)
	}
	return s
}

func sayInFlightOf(r Reason) string {
	if r.Limit <= 0 {
		return fmt.Sprintf("%d concurrent requests are in flight under policy '%s', and %d more may start", r.Used, r.Policy, max(r.Left, 0))
	}
	return fmt.Sprintf("%d of %s concurrent requests are in flight under policy '%s'", r.Used, Grouped(r.Limit), r.Policy)
}

func sayNoLimit(r Reason) string {
	return "no limit is known to bind this key right now; go ahead at a steady pace"
}
