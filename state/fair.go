package state

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

var (
	qLastPrincipalSend = newQuery("LastPrincipalSend")
	qNumberPrincipal   = newQuery("NumberPrincipal")
	// qPrincipalSends reads the first attempt of key (?1) by principal
	// (?2) after a time (?3), with the principal's last number.
	qPrincipalSends = newQuery("PrincipalSends")
	// (the range ends at noLater)
	qWaiting = newQuery("Waiting")
	// (the range starts at noEarlier)
	qForgetWaiters = newQuery("ForgetWaiters")
	// (the range starts at noEarlier)
	qSweepWaiters = newQuery("SweepWaiters")
	qWait         = newQuery("Wait")
)

// numberPrincipal numbers admission id of a in its principal's log, after
// the principal's latest (the pacer records admissions in order; one
// recorded out of order leaves the principal's numbers as they were, and
// its count may err for one window, as a caller's does in WindowOf).
func (tx *Tx) numberPrincipal(id int64, a ledger.Attempt) error {
	var last int64
	err := tx.queryRow(qLastPrincipalSend, a.Key, a.Principal).Scan(&last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	_, err = tx.exec(qNumberPrincipal, a.Principal, last+1, id)
	return err
}

// PrincipalWindow returns, for each of principals with an admission of
// key after since recorded with a principal, how many and the oldest:
// each read from the principal's own numbered log, so the cost grows with
// the principals asked about, not with the calls the window holds.
func (tx *Tx) PrincipalWindow(key string, since time.Time, principals []string) (map[string]ledger.Use, error) {
	var out map[string]ledger.Use
	for _, p := range principals {
		var first, at, last int64
		err := tx.queryRow(qPrincipalSends, key, p, micros(since)).Scan(&first, &at, &last)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("state: principal window: %w", err)
		}
		if out == nil {
			out = map[string]ledger.Use{}
		}
		out[p] = ledger.Use{Count: int(last - first + 1), Oldest: fromMicros(at)}
	}
	return out, nil
}

// Waiting returns the principals with calls of key waiting at now, in
// any process.
func (tx *Tx) Waiting(key string, now time.Time) ([]string, error) {
	rows, err := tx.query(qWaiting, key, micros(now), int64(noLater))
	if err != nil {
		return nil, fmt.Errorf("state: waiting: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("state: waiting: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// Wait records that principal has calls of key waiting in waiter until
// until (from now on: until now ends the record), and forgets the records
// of key that ran out before now.
func (tx *Tx) Wait(key, principal, waiter string, now, until time.Time) error {
	if _, err := tx.exec(qForgetWaiters, key, micros(now), int64(noEarlier)); err != nil {
		return fmt.Errorf("state: wait: %w", err)
	}
	if _, err := tx.exec(qWait, key, principal, waiter, micros(now), micros(until)); err != nil {
		return fmt.Errorf("state: wait: %w", err)
	}
	return nil
}

// forgetWaiters forgets every key's records of waiting that ran out
// before now: those of keys no call has waited for since (a wait forgets
// its own key's).
func (tx *Tx) forgetWaiters(now time.Time) error {
	_, err := tx.exec(qSweepWaiters, micros(now), int64(noEarlier))
	return err
}
