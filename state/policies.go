package state

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

// A Known is a policy seen for a key (or inferred from a refusal), with
// its latest fresh observation. It is a value.
type Known struct {
	Key string // the key it limits
	ratelimit.Observation
	ReceivedAt time.Time // of the latest observation (for a hidden limit: of its inference)
	// BasisAt is when the observing request was sent: later sends are
	// subtracted from Remaining. A hidden limit, which has no Remaining,
	// keeps there the start of the window it was inferred from.
	BasisAt time.Time
	Hidden  bool   // inferred from a refusal, never announced
	Route   string // method and path of the request that observed it
}

var qKnown = newQuery(`SELECT policy, unit, partition, q, w_us, r, t_us,
	received_at, basis_at, source, hidden, route FROM policies WHERE key = ? ORDER BY policy, unit, partition`)

// Known returns every policy ever seen for key.
func (tx *Tx) Known(key string) ([]Known, error) {
	rows, err := tx.query(qKnown, key)
	if err != nil {
		return nil, fmt.Errorf("state: policies: %w", err)
	}
	defer rows.Close()
	var out []Known
	for rows.Next() {
		k := Known{Key: key}
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

var qPutKnown = newQuery(`INSERT INTO policies
	(key, policy, unit, partition, q, w_us, r, t_us, received_at, basis_at, source, hidden, route)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (key, policy, unit, partition) DO UPDATE SET
		q = coalesce(excluded.q, q), w_us = coalesce(excluded.w_us, w_us),
		r           = CASE WHEN excluded.r IS NULL THEN r ELSE excluded.r END,
		t_us        = CASE WHEN excluded.r IS NULL THEN t_us ELSE excluded.t_us END,
		received_at = CASE WHEN excluded.r IS NULL AND NOT excluded.hidden THEN received_at ELSE excluded.received_at END,
		basis_at    = CASE WHEN excluded.r IS NULL AND NOT excluded.hidden THEN basis_at ELSE excluded.basis_at END,
		route       = CASE WHEN excluded.r IS NULL AND NOT excluded.hidden THEN route ELSE excluded.route END,
		source = excluded.source, hidden = excluded.hidden`)

// PutKnown records k as the latest state of its policy. A field the new
// observation does not state keeps its earlier value: a response that
// states only q and w (a policy listed but not shown) leaves the last r and
// t (and when they were received) as they were, and one that shows only r
// does not make q or w unknown. A hidden limit (k.Hidden) is re-inferred
// whole: its q, w and time replace the earlier ones.
func (tx *Tx) PutKnown(k Known) error {
	_, err := tx.exec(qPutKnown,
		k.Key, k.Policy, string(k.Unit), k.Partition, nullIf(k.Quota, k.HasQuota), nullIf(k.Window.Microseconds(), k.Window > 0),
		nullIf(k.Remaining, k.HasRemaining), nullIf(k.Reset.Microseconds(), k.HasReset),
		micros(k.ReceivedAt), micros(k.BasisAt), string(k.Shape), k.Hidden, k.Route)
	if err != nil {
		return fmt.Errorf("state: record policy: %w", err)
	}
	return nil
}

// An ObservationRecord is an observation as stored, with its context:
// which answer to which request said it, and when. It is a value.
type ObservationRecord struct {
	ID        int64  // assigned when stored
	Key       string // the key whose answer said it
	AttemptID int64  // the attempt answered; 0 when none
	ratelimit.Observation
	Status     int       // the answer's HTTP status
	ReceivedAt time.Time // when the answer came (local clock)
	ServerDate time.Time // the answer's Date; zero when it had none
	FromCache  bool      // the answer came from a cache: not a fresh word
	Method     string    // of the request
	Target     string    // of the request, credential-free
}

var qAddObservation = newQuery(`INSERT INTO observations
	(key, attempt_id, policy, unit, partition, q, w_us, r, t_us, status, received_at, server_date,
	 shape, profile, guessed, from_cache, method, target)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)

// AddObservation records o.
func (tx *Tx) AddObservation(o ObservationRecord) error {
	_, err := tx.exec(qAddObservation,
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

var qObservations = newQuery(`SELECT id, coalesce(attempt_id, 0), policy, unit, partition, q, w_us, r, t_us,
	status, received_at, coalesce(server_date, 0), shape, profile, guessed, from_cache, method, target
	FROM observations WHERE key = ? ORDER BY id DESC LIMIT ?`)

// Observations returns the latest observations of key, newest first.
func (tx *Tx) Observations(key string, limit int) ([]ObservationRecord, error) {
	rows, err := tx.query(qObservations, key, limit)
	if err != nil {
		return nil, fmt.Errorf("state: observations: %w", err)
	}
	defer rows.Close()
	return scanObservations(rows, key)
}

// scanObservations reads key's observations selected as qObservations
// selects them.
func scanObservations(rows *sql.Rows, key string) ([]ObservationRecord, error) {
	var out []ObservationRecord
	for rows.Next() {
		o := ObservationRecord{Key: key}
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

// A Gate is a time before which nothing of its key (or of one policy of
// it, Scope) may be sent.
type Gate struct {
	Key    string    // the key it closes
	Scope  string    // "" for the whole key
	Until  time.Time // closed until then
	Reason string    // why, as a clause a caller is shown
	Source string    // retry-after, backoff, circuit, abnormal-usage, problem
	SetAt  time.Time // when it was closed
}

var qGates = newQuery(`SELECT scope, until, reason, source, set_at FROM gates
	WHERE key = ? AND until > ? ORDER BY until DESC`)

// Gates returns key's gates that are still closed at now, the latest to
// open first.
func (tx *Tx) Gates(key string, now time.Time) ([]Gate, error) {
	rows, err := tx.query(qGates, key, micros(now))
	if err != nil {
		return nil, fmt.Errorf("state: gates: %w", err)
	}
	defer rows.Close()
	var out []Gate
	for rows.Next() {
		g := Gate{Key: key}
		var until, set int64
		if err := rows.Scan(&g.Scope, &until, &g.Reason, &g.Source, &set); err != nil {
			return nil, err
		}
		g.Until, g.SetAt = fromMicros(until), fromMicros(set)
		out = append(out, g)
	}
	return out, rows.Err()
}

var qPutGate = newQuery(`INSERT INTO gates (key, scope, until, reason, source, set_at)
	VALUES (?, ?, ?, ?, ?, ?)
	ON CONFLICT (key, scope) DO UPDATE SET until = excluded.until, reason = excluded.reason,
		source = excluded.source, set_at = excluded.set_at
	WHERE excluded.until > gates.until`)

// PutGate closes g's scope until g.Until. An existing gate of the same
// scope that stays closed longer is kept: a gate is never shortened.
func (tx *Tx) PutGate(g Gate) error {
	_, err := tx.exec(qPutGate, g.Key, g.Scope, micros(g.Until), g.Reason, g.Source, micros(g.SetAt))
	if err != nil {
		return fmt.Errorf("state: record gate: %w", err)
	}
	return nil
}

// KeyState is the pacing state of one key, shared by every process. The
// zero KeyState is a key never used.
type KeyState struct {
	Key            string        // the key's name
	LastAdmitAt    time.Time     // the latest admission, by any process
	Interval       time.Duration // slow-start spacing between admissions
	LastResponseAt time.Time     // the latest answer from the upstream
	Failures       int           // consecutive 429/5xx answers without guidance
	Opens          int           // times the circuit opened in a row
	HalfOpen       bool          // the next call is a probe
	ProbeAttempt   int64         // the probe in flight; 0 when none
	ProbeUntil     time.Time     // the probe's lease
	// Latency is the longest time from admission to answer of the key's
	// calls answered since LatencySince, and PrevLatency the longest of
	// the period before: a send may reach the upstream that long after
	// its admission.
	Latency      time.Duration
	PrevLatency  time.Duration
	LatencySince time.Time
}

var qKeyState = newQuery(`SELECT last_admit_at, interval_us, last_response_at, failures, opens,
	half_open, probe_attempt, probe_until, latency_us, prev_latency_us, latency_since FROM key_state WHERE key = ?`)

// KeyState returns key's pacing state; a key never used has the zero state.
func (tx *Tx) KeyState(key string) (KeyState, error) {
	s := KeyState{Key: key}
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

var qPutKeyState = newQuery(`INSERT INTO key_state
	(key, last_admit_at, interval_us, last_response_at, failures, opens, half_open, probe_attempt, probe_until,
	 latency_us, prev_latency_us, latency_since)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (key) DO UPDATE SET last_admit_at = excluded.last_admit_at, interval_us = excluded.interval_us,
		last_response_at = excluded.last_response_at, failures = excluded.failures, opens = excluded.opens,
		half_open = excluded.half_open, probe_attempt = excluded.probe_attempt, probe_until = excluded.probe_until,
		latency_us = excluded.latency_us, prev_latency_us = excluded.prev_latency_us, latency_since = excluded.latency_since`)

// PutKeyState records s.
func (tx *Tx) PutKeyState(s KeyState) error {
	_, err := tx.exec(qPutKeyState,
		s.Key, micros(s.LastAdmitAt), s.Interval.Microseconds(), micros(s.LastResponseAt), s.Failures, s.Opens,
		s.HalfOpen, s.ProbeAttempt, micros(s.ProbeUntil), s.Latency.Microseconds(), s.PrevLatency.Microseconds(),
		micros(s.LatencySince))
	if err != nil {
		return fmt.Errorf("state: record key state: %w", err)
	}
	return nil
}

// A Warning is something a key's users should hear about.
type Warning struct {
	ID      int64     // assigned when stored
	Key     string    // the key it is about
	At      time.Time // when it was raised
	Kind    string    // hidden-limit, abnormal-usage, circuit-open
	Message string    // a clause a caller is shown
}

var qAddWarning = newQuery(`INSERT INTO warnings (key, at, kind, message) VALUES (?, ?, ?, ?)`)

// AddWarning records w.
func (tx *Tx) AddWarning(w Warning) error {
	_, err := tx.exec(qAddWarning, w.Key, micros(w.At), w.Kind, w.Message)
	if err != nil {
		return fmt.Errorf("state: record warning: %w", err)
	}
	return nil
}

var qWarnings = newQuery(`SELECT id, at, kind, message FROM warnings
	WHERE key = ? AND at > ? ORDER BY id DESC LIMIT 20`)

// Warnings returns key's warnings raised after since, newest first (at
// most 20).
func (tx *Tx) Warnings(key string, since time.Time) ([]Warning, error) {
	rows, err := tx.query(qWarnings, key, micros(since))
	if err != nil {
		return nil, fmt.Errorf("state: warnings: %w", err)
	}
	defer rows.Close()
	var out []Warning
	for rows.Next() {
		w := Warning{Key: key}
		var at int64
		if err := rows.Scan(&w.ID, &at, &w.Kind, &w.Message); err != nil {
			return nil, err
		}
		w.At = fromMicros(at)
		out = append(out, w)
	}
	return out, rows.Err()
}
