package state

import (
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

var qTimeline = newQuery("Timeline")

// Timeline counts key's attempts from since on, per step and state (the
// upstream's refusals apart by status), by the time each was sent (or
// refused, or admitted when not yet sent). Its cost grows with the
// attempts counted.
func (tx *Tx) Timeline(key string, since time.Time, step time.Duration) ([]ledger.Bucket, error) {
	us := step.Microseconds()
	if us <= 0 {
		return nil, fmt.Errorf("state: timeline: step %v is not positive", step)
	}
	rows, err := tx.query(qTimeline, key, micros(since), us)
	if err != nil {
		return nil, fmt.Errorf("state: timeline: %w", err)
	}
	defer rows.Close()
	var out []ledger.Bucket
	for rows.Next() {
		var b ledger.Bucket
		var n int64
		if err := rows.Scan(&n, &b.State, &b.Status, &b.Count); err != nil {
			return nil, err
		}
		b.Start = since.Add(time.Duration(n) * step)
		out = append(out, b)
	}
	return out, rows.Err()
}

// A call ID is never empty (on PostgreSQL, attempts_call holds only those
// that are not).
var qCall = newQuery("Call")

// Call returns the attempts of key's call callID, first first.
func (tx *Tx) Call(key, callID string) ([]ledger.Attempt, error) {
	rows, err := tx.query(qCall, key, callID)
	if err != nil {
		return nil, fmt.Errorf("state: call: %w", err)
	}
	defer rows.Close()
	return scanAttempts(rows)
}

var qObservationsOf = newQuery("ObservationsOf")

// ObservationsOf returns the observations the answer to key's attempt
// attemptID produced, in the order they were recorded.
func (tx *Tx) ObservationsOf(key string, attemptID int64) ([]ledger.ObservationRecord, error) {
	rows, err := tx.query(qObservationsOf, key, attemptID)
	if err != nil {
		return nil, fmt.Errorf("state: observations: %w", err)
	}
	defer rows.Close()
	return scanObservations(rows, key)
}
