package report

import (
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// ActivityPage is a page of activity, newest first, as GET /v1/activity
// and the activity resource answer it.
type ActivityPage struct {
	Activity []Activity `json:"activity"`
	// NextCursor continues the page further back in time (REST only);
	// empty when there is no more.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Activity is one attempt (or one call answered without an attempt) as
// the activity resource, REST's GET /v1/activity and the CLI show it.
type Activity struct {
	ID        int64  `json:"id"`
	At        string `json:"at"`
	Call      string `json:"call"`
	Attempt   int    `json:"attempt"`
	Key       string `json:"key"`
	Caller    string `json:"caller"`
	Transport string `json:"transport"`
	Method    string `json:"method"`
	Target    string `json:"target"`
	State     string `json:"state" jsonschema:"admitted, confirmed, accepted, rejected_upstream, failed, rejected_local, cached or interrupted"`
	Status    int    `json:"status,omitempty"`
	// WaitMS is how long it waited for admission, in milliseconds.
	WaitMS int64  `json:"wait_ms"`
	Probe  bool   `json:"probe,omitempty"`
	Reason string `json:"reason,omitempty"`
	// ReasonKind is which rule Reason comes from, for a program to match
	// on ("late": not sent, because it would have left later than its
	// window's margin allows); empty when there is no reason.
	ReasonKind reason.Kind `json:"reason_kind,omitempty"`
	// Instance is the process that recorded it: with many hosts on one
	// PostgreSQL state, the host that admitted it (host name/process ID).
	Instance string `json:"instance,omitempty"`
}

// NewActivity renders a.
func NewActivity(a ledger.Attempt) Activity {
	return Activity{ID: a.ID, At: a.At.UTC().Format(time.RFC3339Nano), Call: a.CallID, Attempt: a.Attempt, Key: a.Key,
		Caller: a.Caller, Transport: string(a.Transport), Method: a.Method, Target: a.Target, State: string(a.State), Status: a.Status,
		WaitMS: a.Wait.Milliseconds(), Probe: a.Probe, Reason: a.Reason.String(), ReasonKind: a.Reason.Kind, Instance: a.Instance}
}
