package state

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
)

var qSeenPolicies = newQuery("SeenPolicies")

// SeenPolicies returns every policy ever seen for key.
func (tx *Tx) SeenPolicies(key string) ([]ledger.SeenPolicy, error) {
	if known, ok := tx.pg.readSeenPolicies(key); ok {
		return known, nil
	}
	rows, err := tx.query(qSeenPolicies, key)
	if err != nil {
		return nil, fmt.Errorf("state: policies: %w", err)
	}
	defer rows.Close()
	var out []ledger.SeenPolicy
	for rows.Next() {
		k := ledger.SeenPolicy{Key: key}
		var q, w, r, t sql.NullInt64
		var recv, basis int64
		var unit string
		if err := rows.Scan(&k.Policy, &unit, &k.Partition, &q, &w, &r, &t, &recv, &basis, &k.Shape, &k.Hidden, &k.Route); err != nil {
			return nil, err
		}
		k.Unit = ratelimit.Unit(unit)
		k.Quota, k.HasQuota = q.Int64, q.Valid
		k.Window = time.Duration(w.Int64) * time.Microsecond
		k.Remaining, k.HasRemaining = r.Int64, r.Valid
		k.Reset, k.HasReset = time.Duration(t.Int64)*time.Microsecond, t.Valid
		k.ReceivedAt, k.BasisAt = fromMicros(recv), fromMicros(basis)
		out = append(out, k)
	}
	return out, rows.Err()
}

var qPutSeenPolicy = newQuery("PutSeenPolicy")

// PutSeenPolicy records k as the latest state of its policy. A field the new
// observation does not state keeps its earlier value: a response that
// states only q and w (a policy listed but not shown) leaves the last r and
// t (and when they were received) as they were, and one that shows only r
// does not make q or w unknown. A hidden limit (k.Hidden) is re-inferred
// whole: its q, w and time replace the earlier ones.
func (tx *Tx) PutSeenPolicy(k ledger.SeenPolicy) error {
	args := seenPolicyArgs(k)
	if kept, err := tx.pg.putSeenPolicy(k, args); kept { // on PostgreSQL, see admit_postgres.go
		return err
	}
	_, err := tx.exec(qPutSeenPolicy, args...)
	if err != nil {
		return fmt.Errorf("state: record policy: %w", err)
	}
	return nil
}

// seenPolicyArgs returns qPutSeenPolicy's arguments for k.
func seenPolicyArgs(k ledger.SeenPolicy) []any {
	return []any{k.Key, k.Policy, string(k.Unit), k.Partition, nullIf(k.Quota, k.HasQuota), nullIf(k.Window.Microseconds(), k.Window > 0),
		nullIf(k.Remaining, k.HasRemaining), nullIf(k.Reset.Microseconds(), k.HasReset),
		micros(k.ReceivedAt), micros(k.BasisAt), string(k.Shape), k.Hidden, k.Route}
}

var qDeleteSeenPolicy = newQuery("DeleteSeenPolicy")

// DeleteSeenPolicy forgets key's policy of unit in partition, if it is kept.
func (tx *Tx) DeleteSeenPolicy(key, policy string, unit ratelimit.Unit, partition string) error {
	if _, err := tx.exec(qDeleteSeenPolicy, key, policy, string(unit), partition); err != nil {
		return fmt.Errorf("state: forget policy: %w", err)
	}
	return nil
}

var qAddObservation = newQuery("AddObservation")

// AddObservation records o.
func (tx *Tx) AddObservation(o ledger.ObservationRecord) error {
	err := tx.write("record observation", qAddObservation,
		o.Key, nullInt(o.AttemptID), o.Policy, string(o.Unit), o.Partition,
		nullIf(o.Quota, o.HasQuota), nullIf(o.Window.Microseconds(), o.Window > 0),
		nullIf(o.Remaining, o.HasRemaining), nullIf(o.Reset.Microseconds(), o.HasReset),
		o.Status, micros(o.ReceivedAt), nullInt(micros(o.ServerDate)),
		string(o.Shape), string(o.Profile), o.Guessed, o.FromCache, o.Method, o.Target)
	if err != nil {
		return fmt.Errorf("state: record observation: %w", err)
	}
	return nil
}

// On PostgreSQL the latest of a key's observations are found in the
// key's own index first: a generic plan (see noEarlier) walks the table's
// newest end instead, past every other key's, for as long as it takes.
var qObservations = newQuery("Observations")

// Observations returns the latest observations of key, newest first.
func (tx *Tx) Observations(key string, limit int) ([]ledger.ObservationRecord, error) {
	rows, err := tx.query(qObservations, key, limit)
	if err != nil {
		return nil, fmt.Errorf("state: observations: %w", err)
	}
	defer rows.Close()
	return scanObservations(rows, key)
}

// scanObservations reads key's observations selected as qObservations
// selects them.
func scanObservations(rows *sql.Rows, key string) ([]ledger.ObservationRecord, error) {
	var out []ledger.ObservationRecord
	for rows.Next() {
		o := ledger.ObservationRecord{Key: key}
		var q, w, r, t sql.NullInt64
		var recv, date int64
		var unit, shape, profile string
		if err := rows.Scan(&o.ID, &o.AttemptID, &o.Policy, &unit, &o.Partition, &q, &w, &r, &t,
			&o.Status, &recv, &date, &shape, &profile, &o.Guessed, &o.FromCache, &o.Method, &o.Target); err != nil {
			return nil, err
		}
		o.Unit, o.Shape, o.Profile = ratelimit.Unit(unit), ratelimit.Shape(shape), ratelimit.Profile(profile)
		o.Quota, o.HasQuota = q.Int64, q.Valid
		o.Window = time.Duration(w.Int64) * time.Microsecond
		o.Remaining, o.HasRemaining = r.Int64, r.Valid
		o.Reset, o.HasReset = time.Duration(t.Int64)*time.Microsecond, t.Valid
		o.ReceivedAt, o.ServerDate = fromMicros(recv), fromMicros(date)
		out = append(out, o)
	}
	return out, rows.Err()
}

var qGates = newQuery("Gates")

// Gates returns key's gates that are still closed at now, the latest to
// open first.
func (tx *Tx) Gates(key string, now time.Time) ([]ledger.Gate, error) {
	if gates, ok := tx.pg.readGates(key, now); ok {
		return gates, nil
	}
	rows, err := tx.query(qGates, key, micros(now))
	if err != nil {
		return nil, fmt.Errorf("state: gates: %w", err)
	}
	defer rows.Close()
	var out []ledger.Gate
	for rows.Next() {
		g := ledger.Gate{Key: key}
		var until, set int64
		var said string
		var why sql.NullString
		if err := rows.Scan(&g.Scope, &until, &said, &why, &g.Source, &set); err != nil {
			return nil, err
		}
		if g.Reason, err = readWhy(why, said); err != nil {
			return nil, err
		}
		g.Until, g.SetAt = fromMicros(until), fromMicros(set)
		out = append(out, g)
	}
	return out, rows.Err()
}

var qPutGate = newQuery("PutGate")

// PutGate closes g's scope until g.Until. An existing gate of the same
// scope that stays closed longer is kept: a gate is never shortened.
func (tx *Tx) PutGate(g ledger.Gate) error {
	why, err := storedWhy(g.Reason)
	if err != nil {
		return err
	}
	_, err = tx.exec(qPutGate, g.Key, g.Scope, micros(g.Until), why, string(g.Source), micros(g.SetAt), olderWords(g.Reason))
	if err != nil {
		return fmt.Errorf("state: record gate: %w", err)
	}
	return nil
}

var qKeyState = newQuery("KeyState")

// KeyState returns key's pacing state; a key never used has the zero state.
func (tx *Tx) KeyState(key string) (ledger.KeyState, error) {
	if s, ok := tx.pg.keyState(key); ok {
		return s, nil
	}
	s, err := tx.readKeyState(key)
	if err == nil {
		tx.pg.keepKeyState(s, false)
	}
	return s, err
}

func (tx *Tx) readKeyState(key string) (ledger.KeyState, error) {
	s := ledger.KeyState{Key: key}
	var last, interval, resp, probeUntil, lat, prevLat, latSince int64
	err := tx.queryRow(qKeyState, key).
		Scan(&last, &interval, &resp, &s.Failures, &s.Opens, &s.HalfOpen, &s.ProbeAttempt, &probeUntil, &lat, &prevLat, &latSince)
	if errors.Is(err, sql.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("state: key state: %w", err)
	}
	s.LastAdmitAt, s.LastResponseAt, s.ProbeUntil = fromMicros(last), fromMicros(resp), fromMicros(probeUntil)
	s.Interval = time.Duration(interval) * time.Microsecond
	s.Latency, s.PrevLatency = time.Duration(lat)*time.Microsecond, time.Duration(prevLat)*time.Microsecond
	s.LatencySince = fromMicros(latSince)
	return s, nil
}

var qPutKeyState = newQuery("PutKeyState")

// PutKeyState records s. On PostgreSQL, for a key the transaction
// holds, it is written once, before the commit, however many times the
// transaction puts it (see pgTx.keyStates).
func (tx *Tx) PutKeyState(s ledger.KeyState) error {
	if tx.pg.keepKeyState(s, true) {
		return nil
	}
	return tx.writeKeyState(s)
}

func (tx *Tx) writeKeyState(s ledger.KeyState) error {
	if _, err := tx.exec(qPutKeyState, keyStateArgs(s)...); err != nil {
		return fmt.Errorf("state: record key state: %w", err)
	}
	return nil
}

// keyStateArgs are qPutKeyState's arguments for s.
func keyStateArgs(s ledger.KeyState) []any {
	return []any{s.Key, micros(s.LastAdmitAt), s.Interval.Microseconds(), micros(s.LastResponseAt), s.Failures, s.Opens,
		s.HalfOpen, s.ProbeAttempt, micros(s.ProbeUntil), s.Latency.Microseconds(), s.PrevLatency.Microseconds(),
		micros(s.LatencySince)}
}

var qPathState = newQuery("PathState")

// PathState returns the failures of key's calls on one route (scope).
func (tx *Tx) PathState(key, scope string) (ledger.PathState, error) {
	s := ledger.PathState{Key: key, Scope: scope}
	var last int64
	err := tx.queryRow(qPathState, key, scope).Scan(&s.Failures, &s.Opens, &s.HalfOpen, &last)
	if errors.Is(err, sql.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("state: route failures: %w", err)
	}
	s.LastAt = fromMicros(last)
	return s, nil
}

var qPutPathState = newQuery("PutPathState")

// PutPathState records s.
func (tx *Tx) PutPathState(s ledger.PathState) error {
	if _, err := tx.exec(qPutPathState, s.Key, s.Scope, s.Failures, s.Opens, s.HalfOpen, micros(s.LastAt)); err != nil {
		return fmt.Errorf("state: record route failures: %w", err)
	}
	return nil
}

var qFailingPaths = newQuery("FailingPaths")

// FailingPaths returns how many of key's routes have a failure after
// since.
func (tx *Tx) FailingPaths(key string, since time.Time) (int, error) {
	var n int
	if err := tx.queryRow(qFailingPaths, key, micros(since)).Scan(&n); err != nil {
		return 0, fmt.Errorf("state: failing routes: %w", err)
	}
	return n, nil
}

var (
	qForgetPaths     = newQuery("ForgetPaths")
	qForgetPathGates = newQuery("ForgetPathGates")
)

// ForgetPaths forgets the failures of key's routes whose latest is
// before before, and the gates of its routes that reopened before it.
func (tx *Tx) ForgetPaths(key string, before time.Time) error {
	if _, err := tx.exec(qForgetPaths, key, micros(before)); err != nil {
		return fmt.Errorf("state: forget route failures: %w", err)
	}
	if _, err := tx.exec(qForgetPathGates, key, micros(before)); err != nil {
		return fmt.Errorf("state: forget route gates: %w", err)
	}
	return nil
}

var qAddWarning = newQuery("AddWarning")

// AddWarning records w.
func (tx *Tx) AddWarning(w ledger.Warning) error {
	why, err := storedWhy(w.Reason)
	if err != nil {
		return err
	}
	_, err = tx.exec(qAddWarning, w.Key, micros(w.At), w.Kind, why, olderWords(w.Reason))
	if err != nil {
		return fmt.Errorf("state: record warning: %w", err)
	}
	return nil
}

// (since a time up to noLater)
var qWarnings = newQuery("Warnings")

// Warnings returns key's warnings raised after since, newest first (at
// most 20).
func (tx *Tx) Warnings(key string, since time.Time) ([]ledger.Warning, error) {
	rows, err := tx.query(qWarnings, key, micros(since), int64(noLater))
	if err != nil {
		return nil, fmt.Errorf("state: warnings: %w", err)
	}
	defer rows.Close()
	var out []ledger.Warning
	for rows.Next() {
		w := ledger.Warning{Key: key}
		var at int64
		var said string
		var why sql.NullString
		if err := rows.Scan(&w.ID, &at, &w.Kind, &said, &why); err != nil {
			return nil, err
		}
		if w.Reason, err = readWhy(why, said); err != nil {
			return nil, err
		}
		w.At = fromMicros(at)
		out = append(out, w)
	}
	return out, rows.Err()
}

// (since a time up to noLater)
var qWarned = newQuery("Warned")

// Warned reports whether a warning of kind was raised for key after
// since.
func (tx *Tx) Warned(key string, kind ledger.WarningKind, since time.Time) (bool, error) {
	var warned bool
	if err := tx.queryRow(qWarned, key, string(kind), micros(since), int64(noLater)).Scan(&warned); err != nil {
		return false, fmt.Errorf("state: warned: %w", err)
	}
	return warned, nil
}
