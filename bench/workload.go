package bench

import (
	"context"
	"time"

	"github.com/mcp-quota/mcp-quota/clock"
)

// A Tally is what one caller saw in a run.
type Tally struct {
	Caller string `json:"caller"`
	// Accepted counts the calls the upstream accepted, as the caller saw
	// them.
	Accepted int `json:"accepted"`
	// GaveUp counts the calls the client gave up on (the caller then made
	// the call again at once).
	GaveUp int `json:"gave_up"`
	// Errors counts calls that ended without an answer (the run's end
	// cutting a call short is not one).
	Errors int `json:"errors"`
	// FirstError is the first of them.
	FirstError string `json:"first_error,omitempty"`
	// LongestWait is the longest the caller waited for one call: from the
	// moment it wanted the call (its first attempt, or the previous call's
	// answer) to the answer that accepted it, across the client's give-ups.
	// A call still waiting when the run ends counts up to the end.
	LongestWait time.Duration `json:"longest_wait"`
}

// greedy is the workload: a caller that makes calls as fast as the client
// lets it until end, one after another, on clk (nil means real time). ctx
// should end at end, so that a call in progress then is cut short.
func greedy(ctx context.Context, c caller, end time.Time, clk clock.Clock) Tally {
	clk = clock.Or(clk)
	var t Tally
	wanted := clk.Now()
	for clk.Now().Before(end) {
		ok, err := c.call(ctx)
		at := clk.Now()
		if ctx.Err() != nil || !at.Before(end) {
			break // the run ended while the call waited
		}
		switch {
		case err != nil:
			t.Errors++
			if t.FirstError == "" {
				t.FirstError = err.Error()
			}
		case ok:
			t.Accepted++
			t.LongestWait = max(t.LongestWait, at.Sub(wanted))
			wanted = at
		default:
			t.GaveUp++
		}
	}
	at := clk.Now()
	if at.After(end) {
		at = end
	}
	if at.After(wanted) {
		t.LongestWait = max(t.LongestWait, at.Sub(wanted))
	}
	return t
}
