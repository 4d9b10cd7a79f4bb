// Package reason holds why mcp-quota holds a call back, refuses it or
// advises a pace, as data — which policy, how many, how long — and says
// it in English. It is the one place where mcp-quota's reasons, advice
// and the notes it keeps about a key are worded: the pacer decides and
// carries a Reason; whoever shows it (a tool result, a REST problem, the
// activity, the status command) has it said here.
//
// The package imports nothing of mcp-quota but ratelimit, so that both
// the pacer, which keeps reasons in what it records, and report, which
// shows the pacer's state, can use it.
package reason

import (
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A Kind says which rule a Reason comes from; it decides which of a
// Reason's fields mean something.
type Kind string

// The kinds of reasons, and the fields each one fills.
const (
	// Said is a reason kept as words only (Said): a gate or a warning
	// the state held before reasons were stored as data (for a gate,
	// Source names what closed it).
	Said Kind = "said"
	// WindowSpent: every call of a windowed policy is used (Policy,
	// Limit, Window; Held of them are kept for others' reservations).
	WindowSpent Kind = "window-spent"
	// WindowLow: a windowed policy is below its low-water mark, so calls
	// are spread (Policy, Left, Limit, Spacing).
	WindowLow Kind = "window-low"
	// UpstreamLow: the upstream's r is below its low-water mark, so calls
	// are spread (Policy, Unit, Left, For, Spacing).
	UpstreamLow Kind = "upstream-low"
	// UpstreamSpent: the upstream says nothing is left (Policy, Unit,
	// Limit when it said q, else 0; For).
	UpstreamSpent Kind = "upstream-spent"
	// UpstreamShort: the upstream says less is left than the request
	// carries (Policy, Unit, Left, For, Carries).
	UpstreamShort Kind = "upstream-short"
	// ProbeAsking: a probe is out for a fresh answer, and calls wait for
	// it.
	ProbeAsking Kind = "probe-asking"
	// ProbeDue: the upstream's last answer on a policy expired, and one
	// probe goes after For (Policy, For).
	ProbeDue Kind = "probe-due"
	// InFlight: the key's own most calls at once are in flight (InFlight).
	InFlight Kind = "in-flight"
	// Spaced: calls go Spacing apart (the key's pace, or slow start).
	Spaced Kind = "spaced"
	// BytesNever: the request carries more content-bytes than a policy
	// allows in any window (Policy, Carries, Limit, Window).
	BytesNever Kind = "bytes-never"
	// BytesShort: fewer content-bytes are left than the request carries
	// (Policy, Left, Limit, Window, Carries).
	BytesShort Kind = "bytes-short"
	// ConcurrencyFull: every concurrent request a policy allows is in
	// flight (Policy, Limit; with no Limit, InFlight as many as the
	// upstream's last answer allows).
	ConcurrencyFull Kind = "concurrency-full"
	// ShareSpent: a principal used its share of a policy (Principal,
	// Share, Used of Limit calls per Window of Policy; Left for the
	// others).
	ShareSpent Kind = "share-spent"
	// Turn: principals take turns by their shares, and Other (Behind of
	// this window's calls) is further behind than Principal (Used); Left
	// calls are left.
	Turn Kind = "turn"
	// BucketFull: the upstream's leaky bucket is full (Policy, Limit),
	// leaking Rate calls a second, and the next call fits in For.
	BucketFull Kind = "bucket-full"

	// What the pacer notes about a key: closed gates' reasons, warnings,
	// and how an attempt ended.

	// RetryAfterAsked: the upstream answered Status and asked to wait For
	// (Retry-After).
	RetryAfterAsked Kind = "retry-after"
	// Abnormal: the upstream reported abnormal usage of Key (Violated
	// names the policies it said were violated, space-separated), and
	// calls pause until Until.
	Abnormal Kind = "abnormal-usage"
	// CircuitOpen: Key's circuit opened after Failures refusals or
	// failures without guidance, and one probe goes in For.
	CircuitOpen Kind = "circuit-open"
	// CircuitReopen: Key's circuit opened again because its probe failed,
	// and the next probe goes in For.
	CircuitReopen Kind = "circuit-reopen"
	// BackOff: the upstream answered Status (0: nothing, the request
	// failed) without saying when to come back, or (Short) asked to wait
	// only For, too short to trust; this is failure Failures in a row.
	BackOff Kind = "backoff"
	// RouteBackOff: the upstream answered Status to Route without a
	// rate-limit signal; failure Failures on that route within Window.
	RouteBackOff Kind = "route-backoff"
	// RouteCircuit: the circuit for Route of Key opened for For.
	RouteCircuit Kind = "route-circuit"
	// HiddenLimit: Key hit a limit the upstream never announced (Policy,
	// the name mcp-quota gave it), now enforced as Limit calls per Window.
	HiddenLimit Kind = "hidden-limit"
	// HiddenStretched: Key was refused again by the hidden limit Policy,
	// whose window is longer than it seemed: Limit calls per Window.
	HiddenStretched Kind = "hidden-stretched"
	// HiddenUnaccepted: Key was refused by the hidden limit Policy before
	// any call of it was accepted.
	HiddenUnaccepted Kind = "hidden-unaccepted"
	// WindowEdge: Key was refused for a call sent as Policy (Limit calls
	// per Window) freed a slot, a moment before the upstream's own window
	// freed it.
	WindowEdge Kind = "window-edge"
	// PolicyBound: Key's upstream announced more than mcp-quota keeps for
	// one key (Limit policies, Buckets route buckets); the least
	// restrictive are folded into Policy.
	PolicyBound Kind = "policy-bound"
	// Late: an attempt not sent, because it would have left For after its
	// admission, later than the Allowed its window's margin allows.
	Late Kind = "late"
	// Answered: how an attempt ended: HTTP Status.
	Answered Kind = "answered"

	// Why an attempt (the activity's) ended as it did, beside Late and
	// Answered.

	// RefusedLocal: a call refused before any try, to retry after
	// RetryAfter, for the reason of kind Because (the other fields are
	// that reason's).
	RefusedLocal Kind = "refused-local"
	// Failed: the request failed with no answer (Error).
	Failed Kind = "failed"
	// Interrupted: the process handling an attempt ended before its
	// answer was recorded.
	Interrupted Kind = "interrupted"
	// Unreported: a reserved slot's process ended before reporting its
	// call, and the slot stays counted as sent.
	Unreported Kind = "unreported"
	// Reserved: a slot of a lease, reserved for a batch of calls of one
	// process and not handed out yet.
	Reserved Kind = "reserved"
	// Unneeded: a reserved slot given back unused, counted because later
	// admissions follow it.
	Unneeded Kind = "unneeded"
	// KeptPage: a page read from the answer kept For ago; nothing was
	// sent.
	KeptPage Kind = "kept-page"
	// LoopGuard: an identical request answered from the stored copy, its
	// answer unchanged; nothing was sent.
	LoopGuard Kind = "loop-guard"

	// What advice says is left.

	// CallsLeft: Left more calls can be made in the next For.
	CallsLeft Kind = "calls-left"
	// BytesLeft: Left of Limit content-bytes are left under Policy for
	// the next For (none said when For is 0).
	BytesLeft Kind = "bytes-left"
	// InFlightOf: Used of Limit concurrent requests are in flight under
	// Policy (with no Limit, Left more may start).
	InFlightOf Kind = "in-flight-of"
	// NoLimit: no limit is known to bind the key.
	NoLimit Kind = "no-limit"
)

// A Reason is why a call waits, is refused or is advised a pace, as
// data. The zero Reason says nothing. Only the fields its Kind names
// mean something; String words it. Its JSON form (the kind and the fields
// that are not zero) is how the state keeps it.
type Reason struct {
	Kind   Kind           `json:"kind"`
	Policy string         `json:"policy,omitzero"` // the policy it is about
	Unit   ratelimit.Unit `json:"unit,omitzero"`   // what Left, Limit and Carries count, for an upstream policy
	// Principal is the principal it is about, for a share or a turn;
	// Other is the principal further behind, for a turn.
	Principal string        `json:"principal,omitzero"`
	Other     string        `json:"other,omitzero"`
	Share     float64       `json:"share,omitzero"`    // the principal's share of the key
	Limit     int64         `json:"limit,omitzero"`    // the policy's quota per window (q); 0 when unknown
	Used      int64         `json:"used,omitzero"`     // spent of Limit, or the principal's calls in the window
	Left      int64         `json:"left,omitzero"`     // what is left
	Held      int64         `json:"held,omitzero"`     // of Limit, kept for other callers' reservations
	Carries   int64         `json:"carries,omitzero"`  // what the request carries, in Unit
	InFlight  int64         `json:"inFlight,omitzero"` // calls in flight
	Behind    int64         `json:"behind,omitzero"`   // the calls of the principal further behind, for a turn
	Window    time.Duration `json:"window,omitzero"`
	For       time.Duration `json:"for,omitzero"`      // how long it holds, or how long until it ends
	Spacing   time.Duration `json:"spacing,omitzero"`  // how far apart calls go
	Rate      float64       `json:"rate,omitzero"`     // calls a second, for a leaking bucket
	Source    string        `json:"source,omitzero"`   // a gate's source, for Said
	Said      string        `json:"said,omitzero"`     // the words kept, for Said
	Key       string        `json:"key,omitzero"`      // the key, for what is noted about it
	Route     string        `json:"route,omitzero"`    // a route of the key ("GET /items")
	Status    int           `json:"status,omitzero"`   // the upstream's HTTP status; 0 when none came
	Failures  int64         `json:"failures,omitzero"` // failures in a row
	Short     bool          `json:"short,omitzero"`    // the wait the upstream asked for was too short to trust
	Allowed   time.Duration `json:"allowed,omitzero"`  // the most a send may leave after its admission, for Late
	Buckets   int64         `json:"buckets,omitzero"`  // route buckets kept for one key
	Until     time.Time     `json:"until,omitzero"`    // when a pause ends
	Violated  string        `json:"violated,omitzero"` // the policies a problem said were violated, space-separated
	// Because is the kind of the reason a call was refused for, and
	// RetryAfter when it may be retried, for RefusedLocal.
	Because    Kind          `json:"because,omitzero"`
	RetryAfter time.Duration `json:"retryAfter,omitzero"`
	Error      string        `json:"error,omitzero"` // what failed, for Failed
}

// IsZero reports whether r says nothing.
func (r Reason) IsZero() bool { return r == Reason{} }

// Map returns r with f applied to each of its text fields (the names and
// words it carries), for example to scrub a secret from what an upstream
// named.
func (r Reason) Map(f func(string) string) Reason {
	r.Policy, r.Principal, r.Other, r.Source, r.Said = f(r.Policy), f(r.Principal), f(r.Other), f(r.Source), f(r.Said)
	r.Key, r.Route, r.Violated, r.Error = f(r.Key), f(r.Route), f(r.Violated), f(r.Error)
	return r
}

// RefusedFor is the reason of a call refused locally for why, to retry
// after after: why with its kind kept as Because.
func RefusedFor(after time.Duration, why Reason) Reason {
	why.Kind, why.Because, why.RetryAfter = RefusedLocal, why.Kind, after
	return why
}
