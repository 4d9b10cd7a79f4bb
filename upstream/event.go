package upstream

import (
	"context"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/pacer"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// An EventKind says which step of a call an Event reports.
type EventKind int

// The steps a Client reports to its Observe hook.
const (
	// Refused: the pacer refused an attempt; nothing was sent. The
	// refusal is in the key's activity (ledger.RejectedLocal).
	Refused EventKind = iota + 1
	// Attempted: an admitted attempt ended, answered or failed.
	Attempted
	// Ended: a call ended, after its last attempt or answered from a
	// stored copy (ledger.Cached, no attempt at all).
	Ended
)

// An Event is one step of a call, as the Client's Observe hook sees it.
// Every call of every transport passes the Client (the fetch tool's
// answers from a stored copy through RecordCached), so a hook sees all of them,
// each call ending exactly once. It is a value and carries no credential.
type Event struct {
	Kind      EventKind
	Key       string // the key's name
	Caller    string
	Transport ledger.Transport // ledger.Stdio, MCPHTTP or REST
	CallID    string
	Attempt   int // the attempt's number; for Ended, how many the call made
	// State is the attempt's state as recorded (ledger.Confirmed,
	// ledger.RejectedLocal, …); for Ended, that of the call's last
	// recorded attempt, or Canceled when none was recorded.
	State  string
	Status int    // the upstream's HTTP status; 0 when no answer came
	Source string // Refused: what bound (a policy, "retry-after", "circuit", "pace", …)
	// Gate is, for Refused, what closed the gate that bound; "" when a
	// policy (whatever its name) or a local limit bound.
	Gate ledger.GateSource
	// Limit is, for Refused, the pacer's own limit that bound (its pace,
	// its most calls at once, …); "" when a policy or a gate bound.
	Limit   pacer.OwnLimit
	Wait    time.Duration // Attempted and Refused: how long the attempt waited for admission
	Latency time.Duration // Attempted: from the send to the answer, or to the failure
	// HeldBy is, for Attempted, what held the attempt while it waited
	// for admission (as Source names it); "" when it did not wait.
	HeldBy string
	Method string // Attempted and Refused: the attempt's method
	Target string // Attempted and Refused: what was asked for, as the activity shows it (credential-free)
	// Reading is, for Attempted, the signals read from the answer (from
	// its header fields with the credential removed); nil when no answer
	// came.
	Reading *ratelimit.Reading
}

// Canceled is the final state of a call that ended (its caller went
// away, or the state file failed) before any of its attempts was
// recorded: it is not in the activity.
const Canceled = "canceled"

func (c *Client) observe(ctx context.Context, e Event) {
	if c.Observe != nil {
		c.Observe(e)
	}
	if c.Watch != nil {
		c.Watch(ctx, e)
	}
}

// RecordCached records that caller's request r through k was answered at at from
// mcp-quota's stored copy of target's last answer, for the reason why:
// nothing was sent and no quota was spent. It is in the activity as
// ledger.Cached, and ends a call for the Observe hook.
func (c *Client) RecordCached(ctx context.Context, k *keystore.Key, r Request, target string, why reason.Reason, at time.Time) error {
	method := r.Method
	if method == "" {
		method = "GET"
	}
	id := NewCallID()
	err := c.pacer.RecordCached(ctx, pacer.Call{Key: k, Caller: r.Caller, Transport: r.Transport, Method: method,
		Target: target, Digest: r.Digest, CallID: id, Attempt: 1}, why, at)
	if err != nil {
		return err
	}
	c.observe(ctx, Event{Kind: Ended, Key: k.Name, Caller: r.Caller, Transport: r.Transport, CallID: id, State: string(ledger.Cached)})
	return nil
}
