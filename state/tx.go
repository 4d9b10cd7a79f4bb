package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/ratelimit"
)

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// A Tx is one transaction on the state file, from DB.Update (read-write)
// or DB.View (read-only). It is not safe for concurrent use and must not
// be kept after the function it was passed to returns.
type Tx struct {
	q   querier
	ctx context.Context
}

// States of an attempt.
const (
	Admitted         = "admitted"          // admitted by the pacer, in flight
	Confirmed        = "confirmed"         // answered by the server: executed (2xx), or answered 3xx/304
	Accepted         = "accepted"          // accepted by the server, not yet executed (202)
	RejectedUpstream = "rejected_upstream" // refused by the server (429, 4xx)
	Failed           = "failed"            // no usable answer: network error, 5xx
	RejectedLocal    = "rejected_local"    // refused by mcp-quota; nothing was sent
	Cached           = "cached"            // answered by mcp-quota from its last answer; nothing was sent
	Interrupted      = "interrupted"       // its process ended before it finished
)

// An Attempt is one try to reach an upstream, or a call refused before
// any try (Attempt 0, State RejectedLocal).
type Attempt struct {
	ID         int64
	CallID     string
	Attempt    int
	Key        string
	Caller     string
	Transport  string
	Method     string
	Target     string
	Digest     string
	State      string
	Reason     string
	Probe      bool
	At         time.Time // admitted or refused at
	Wait       time.Duration
	SentAt     time.Time
	AnsweredAt time.Time
	Status     int
	LeaseUntil time.Time
}

// InsertAttempt records a and returns its ID. An attempt recorded as
// Admitted counts against its key's budget from then on, whatever its end.
func (tx *Tx) InsertAttempt(a Attempt) (int64, error) {
	var lease any
	if !a.LeaseUntil.IsZero() {
		lease = micros(a.LeaseUntil)
	}
	res, err := tx.q.ExecContext(tx.ctx, `INSERT INTO attempts
		(call_id, attempt, key, caller, transport, method, target, digest, state, reason, probe, counted, at, wait_us, lease_until)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		a.CallID, a.Attempt, a.Key, a.Caller, a.Transport, a.Method, a.Target, a.Digest, a.State, a.Reason,
		a.Probe, a.State == Admitted, micros(a.At), a.Wait.Microseconds(), lease)
	if err != nil {
		return 0, fmt.Errorf("state: record attempt: %w", err)
	}
	return res.LastInsertId()
}

// FinishAttempt records how attempt id ended and ends its lease.
func (tx *Tx) FinishAttempt(id int64, state, reason string, status int, sentAt, answeredAt time.Time) error {
	_, err := tx.q.ExecContext(tx.ctx, `UPDATE attempts
		SET state = ?, reason = ?, status = ?, sent_at = ?, answered_at = ?, lease_until = NULL WHERE id = ?`,
		state, reason, nullInt(int64(status)), nullInt(micros(sentAt)), nullInt(micros(answeredAt)), id)
	if err != nil {
		return fmt.Errorf("state: finish attempt: %w", err)
	}
	return nil
}

// Count returns how many attempts of key were admitted after since (the
// sliding-window log).
func (tx *Tx) Count(key string, since time.Time) (int, error) {
	var n int
	err := tx.q.QueryRowContext(tx.ctx, `SELECT count(*) FROM attempts
		WHERE key = ? AND at > ? AND counted = 1`, key, micros(since)).Scan(&n)
	return n, err
}

// CountBy returns how many attempts of key caller had admitted after since.
func (tx *Tx) CountBy(key, caller string, since time.Time) (int, error) {
	var n int
	err := tx.q.QueryRowContext(tx.ctx, `SELECT count(*) FROM attempts
		WHERE key = ? AND at > ? AND counted = 1 AND caller = ?`, key, micros(since), caller).Scan(&n)
	return n, err
}

// Nth returns the admission time of the n-th (1-based) oldest attempt of
// key admitted after since, or the zero time when there are fewer.
func (tx *Tx) Nth(key string, since time.Time, n int) (time.Time, error) {
	if n < 1 {
		return time.Time{}, nil
	}
	var us int64
	err := tx.q.QueryRowContext(tx.ctx, `SELECT at FROM attempts
		WHERE key = ? AND at > ? AND counted = 1 ORDER BY at LIMIT 1 OFFSET ?`,
		key, micros(since), n-1).Scan(&us)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	return fromMicros(us), err
}

// InFlight returns how many attempts of key are admitted and unfinished,
// with a lease that has not run out by now.
func (tx *Tx) InFlight(key string, now time.Time) (int, error) {
	var n int
	err := tx.q.QueryRowContext(tx.ctx, `SELECT count(*) FROM attempts
		WHERE key = ? AND lease_until IS NOT NULL AND lease_until > ?`, key, micros(now)).Scan(&n)
	return n, err
}

// Latest returns the admission time of key's latest admitted attempt, or
// the zero time. Clocks that step back are clamped to it.
func (tx *Tx) Latest(key string) (time.Time, error) {
	var us sql.NullInt64
	err := tx.q.QueryRowContext(tx.ctx, `SELECT max(at) FROM attempts
		WHERE key = ? AND counted = 1`, key).Scan(&us)
	return fromMicros(us.Int64), err
}

// A Known is a policy seen for a key, with its latest fresh observation.
type Known struct {
	Key string
	ratelimit.Observation
	ReceivedAt time.Time // of the latest observation
	BasisAt    time.Time // when its request was sent: later sends are subtracted from Remaining
	Hidden     bool      // inferred from a refusal, never announced
	Route      string    // method and path of the request that observed it
}

// Known returns every policy ever seen for key.
func (tx *Tx) Known(key string) ([]Known, error) {
	rows, err := tx.q.QueryContext(tx.ctx, `SELECT policy, unit, partition, q, w_us, r, t_us,
		received_at, basis_at, source, hidden, route FROM policies WHERE key = ? ORDER BY policy, unit, partition`, key)
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

// PutKnown records k as the latest state of its policy. A field the new
// observation does not state keeps its earlier value: a response that
// states only q and w (a policy listed but not shown) leaves the last r and
// t as they were, and one that shows only r does not make q or w unknown.
func (tx *Tx) PutKnown(k Known) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO policies
		(key, policy, unit, partition, q, w_us, r, t_us, received_at, basis_at, source, hidden, route)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (key, policy, unit, partition) DO UPDATE SET
			q = coalesce(excluded.q, q), w_us = coalesce(excluded.w_us, w_us),
			r           = CASE WHEN excluded.r IS NULL THEN r ELSE excluded.r END,
			t_us        = CASE WHEN excluded.r IS NULL THEN t_us ELSE excluded.t_us END,
			received_at = CASE WHEN excluded.r IS NULL THEN received_at ELSE excluded.received_at END,
			basis_at    = CASE WHEN excluded.r IS NULL THEN basis_at ELSE excluded.basis_at END,
			route       = CASE WHEN excluded.r IS NULL THEN route ELSE excluded.route END,
			source = excluded.source, hidden = excluded.hidden`,
		k.Key, k.Policy, string(k.Unit), k.Partition, nullIf(k.Quota, k.HasQuota), nullIf(k.Window.Microseconds(), k.Window > 0),
		nullIf(k.Remaining, k.HasRemaining), nullIf(k.Reset.Microseconds(), k.HasReset),
		micros(k.ReceivedAt), micros(k.BasisAt), string(k.Shape), k.Hidden, k.Route)
	if err != nil {
		return fmt.Errorf("state: record policy: %w", err)
	}
	return nil
}

// An ObservationRecord is an observation as stored, with its context.
type ObservationRecord struct {
	ID        int64
	Key       string
	AttemptID int64
	ratelimit.Observation
	Status     int
	ReceivedAt time.Time
	ServerDate time.Time
	FromCache  bool
	Method     string
	Target     string
}

// AddObservation records o.
func (tx *Tx) AddObservation(o ObservationRecord) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO observations
		(key, attempt_id, policy, unit, partition, q, w_us, r, t_us, status, received_at, server_date,
		 shape, profile, guessed, from_cache, method, target)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
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

// Observations returns the latest observations of key, newest first.
func (tx *Tx) Observations(key string, limit int) ([]ObservationRecord, error) {
	rows, err := tx.q.QueryContext(tx.ctx, `SELECT id, coalesce(attempt_id, 0), policy, unit, partition, q, w_us, r, t_us,
		status, received_at, coalesce(server_date, 0), shape, profile, guessed, from_cache, method, target
		FROM observations WHERE key = ? ORDER BY id DESC LIMIT ?`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("state: observations: %w", err)
	}
	defer rows.Close()
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
	Key    string
	Scope  string // "" for the whole key
	Until  time.Time
	Reason string
	Source string // retry-after, backoff, circuit, abnormal-usage, problem
	SetAt  time.Time
}

// Gates returns key's gates that are still closed at now.
func (tx *Tx) Gates(key string, now time.Time) ([]Gate, error) {
	rows, err := tx.q.QueryContext(tx.ctx, `SELECT scope, until, reason, source, set_at FROM gates
		WHERE key = ? AND until > ? ORDER BY until DESC`, key, micros(now))
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

// PutGate closes g's scope until g.Until. An existing gate of the same
// scope that stays closed longer is kept: a gate is never shortened.
func (tx *Tx) PutGate(g Gate) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO gates (key, scope, until, reason, source, set_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (key, scope) DO UPDATE SET until = excluded.until, reason = excluded.reason,
			source = excluded.source, set_at = excluded.set_at
		WHERE excluded.until > gates.until`,
		g.Key, g.Scope, micros(g.Until), g.Reason, g.Source, micros(g.SetAt))
	if err != nil {
		return fmt.Errorf("state: record gate: %w", err)
	}
	return nil
}

// KeyState is the pacing state of one key, shared by every process.
type KeyState struct {
	Key            string
	LastAdmitAt    time.Time
	Interval       time.Duration // slow-start spacing between admissions
	LastResponseAt time.Time
	Failures       int  // consecutive 429/5xx answers without guidance
	Opens          int  // times the circuit opened in a row
	HalfOpen       bool // the next call is a probe
	ProbeAttempt   int64
	ProbeUntil     time.Time // the probe's lease
}

// KeyState returns key's pacing state; a key never used has the zero state.
func (tx *Tx) KeyState(key string) (KeyState, error) {
	s := KeyState{Key: key}
	var last, interval, resp, probeUntil int64
	err := tx.q.QueryRowContext(tx.ctx, `SELECT last_admit_at, interval_us, last_response_at, failures, opens,
		half_open, probe_attempt, probe_until FROM key_state WHERE key = ?`, key).
		Scan(&last, &interval, &resp, &s.Failures, &s.Opens, &s.HalfOpen, &s.ProbeAttempt, &probeUntil)
	if errors.Is(err, sql.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("state: key state: %w", err)
	}
	s.LastAdmitAt, s.LastResponseAt, s.ProbeUntil = fromMicros(last), fromMicros(resp), fromMicros(probeUntil)
	s.Interval = time.Duration(interval) * time.Microsecond
	return s, nil
}

// PutKeyState records s.
func (tx *Tx) PutKeyState(s KeyState) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO key_state
		(key, last_admit_at, interval_us, last_response_at, failures, opens, half_open, probe_attempt, probe_until)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET last_admit_at = excluded.last_admit_at, interval_us = excluded.interval_us,
			last_response_at = excluded.last_response_at, failures = excluded.failures, opens = excluded.opens,
			half_open = excluded.half_open, probe_attempt = excluded.probe_attempt, probe_until = excluded.probe_until`,
		s.Key, micros(s.LastAdmitAt), s.Interval.Microseconds(), micros(s.LastResponseAt), s.Failures, s.Opens,
		s.HalfOpen, s.ProbeAttempt, micros(s.ProbeUntil))
	if err != nil {
		return fmt.Errorf("state: record key state: %w", err)
	}
	return nil
}

// A Warning is something a key's users should hear about.
type Warning struct {
	ID      int64
	Key     string
	At      time.Time
	Kind    string // hidden-limit, abnormal-usage, circuit-open
	Message string
}

// AddWarning records w.
func (tx *Tx) AddWarning(w Warning) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO warnings (key, at, kind, message) VALUES (?, ?, ?, ?)`,
		w.Key, micros(w.At), w.Kind, w.Message)
	if err != nil {
		return fmt.Errorf("state: record warning: %w", err)
	}
	return nil
}

// Warnings returns key's warnings raised after since, newest first.
func (tx *Tx) Warnings(key string, since time.Time) ([]Warning, error) {
	rows, err := tx.q.QueryContext(tx.ctx, `SELECT id, at, kind, message FROM warnings
		WHERE key = ? AND at > ? ORDER BY id DESC LIMIT 20`, key, micros(since))
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

// ActivityFilter selects attempts for Activity.
type ActivityFilter struct {
	Key    string    // "" for every key
	Since  time.Time // attempts at or after; zero for all
	Before int64     // cursor: only attempts with a smaller ID; 0 for the newest
	Limit  int       // at most this many; 0 means 100
}

// Activity returns attempts matching f, newest first.
func (tx *Tx) Activity(f ActivityFilter) ([]Attempt, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	before := f.Before
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := tx.q.QueryContext(tx.ctx, `SELECT id, call_id, attempt, key, caller, transport, method, target,
		digest, state, reason, probe, at, wait_us, coalesce(sent_at, 0), coalesce(answered_at, 0), coalesce(status, 0),
		coalesce(lease_until, 0)
		FROM attempts WHERE (? = '' OR key = ?) AND at >= ? AND id < ? ORDER BY id DESC LIMIT ?`,
		f.Key, f.Key, micros(f.Since), before, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("state: activity: %w", err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		var at, wait, sent, answered, lease int64
		if err := rows.Scan(&a.ID, &a.CallID, &a.Attempt, &a.Key, &a.Caller, &a.Transport, &a.Method, &a.Target,
			&a.Digest, &a.State, &a.Reason, &a.Probe, &at, &wait, &sent, &answered, &a.Status, &lease); err != nil {
			return nil, err
		}
		a.At, a.SentAt, a.AnsweredAt, a.LeaseUntil = fromMicros(at), fromMicros(sent), fromMicros(answered), fromMicros(lease)
		a.Wait = time.Duration(wait) * time.Microsecond
		out = append(out, a)
	}
	return out, rows.Err()
}

// Repeats returns how many calls of key with digest were made after since
// (first attempts, whether sent, refused or answered from the cache): the
// loop guard's count of identical requests.
func (tx *Tx) Repeats(key, digest string, since time.Time) (int, error) {
	var n int
	err := tx.q.QueryRowContext(tx.ctx, `SELECT count(*) FROM attempts
		WHERE key = ? AND digest = ? AND at > ? AND attempt <= 1`, key, digest, micros(since)).Scan(&n)
	return n, err
}

// A StoredResponse is the last answer to a GET of one URL of a key.
type StoredResponse struct {
	Key          string
	Target       string
	ETag         string
	LastModified string
	Status       int
	ContentType  string
	Body         []byte
	Digest       string
	StoredAt     time.Time
	Unchanged    int // how many answers in a row were the same as the one before
}

// Response returns the stored answer for key and target, if any.
func (tx *Tx) Response(key, target string) (StoredResponse, bool, error) {
	r := StoredResponse{Key: key, Target: target}
	var at int64
	err := tx.q.QueryRowContext(tx.ctx, `SELECT etag, last_modified, status, content_type, body, digest, stored_at, unchanged
		FROM responses WHERE key = ? AND target = ?`, key, target).
		Scan(&r.ETag, &r.LastModified, &r.Status, &r.ContentType, &r.Body, &r.Digest, &at, &r.Unchanged)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("state: stored response: %w", err)
	}
	r.StoredAt = fromMicros(at)
	return r, true, nil
}

// PutResponse stores r, keeping at most keep answers per key (the oldest
// go first).
func (tx *Tx) PutResponse(r StoredResponse, keep int) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO responses
		(key, target, etag, last_modified, status, content_type, body, digest, stored_at, unchanged)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (key, target) DO UPDATE SET etag = excluded.etag, last_modified = excluded.last_modified,
			status = excluded.status, content_type = excluded.content_type, body = excluded.body,
			digest = excluded.digest, stored_at = excluded.stored_at, unchanged = excluded.unchanged`,
		r.Key, r.Target, r.ETag, r.LastModified, r.Status, r.ContentType, r.Body, r.Digest, micros(r.StoredAt), r.Unchanged)
	if err != nil {
		return fmt.Errorf("state: store response: %w", err)
	}
	_, err = tx.q.ExecContext(tx.ctx, `DELETE FROM responses WHERE key = ? AND target NOT IN
		(SELECT target FROM responses WHERE key = ? ORDER BY stored_at DESC LIMIT ?)`, r.Key, r.Key, keep)
	return err
}

// Sweep marks attempts whose lease ran out before now as interrupted (their
// process ended mid-call), and deletes attempts, observations and warnings
// older than before.
func (tx *Tx) Sweep(now, before time.Time) error {
	if _, err := tx.q.ExecContext(tx.ctx, `UPDATE attempts SET state = 'interrupted', lease_until = NULL,
		reason = 'the process handling it ended before an answer was recorded'
		WHERE lease_until IS NOT NULL AND lease_until <= ?`, micros(now)); err != nil {
		return fmt.Errorf("state: sweep: %w", err)
	}
	for _, q := range []string{
		`DELETE FROM attempts WHERE at < ? AND lease_until IS NULL`,
		`DELETE FROM observations WHERE received_at < ?`,
		`DELETE FROM warnings WHERE at < ?`,
	} {
		if _, err := tx.q.ExecContext(tx.ctx, q, micros(before)); err != nil {
			return fmt.Errorf("state: sweep: %w", err)
		}
	}
	return nil
}

// Keys returns every key the file has state for.
func (tx *Tx) Keys() ([]string, error) {
	rows, err := tx.q.QueryContext(tx.ctx, `SELECT key FROM key_state UNION SELECT key FROM policies ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("state: keys: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

func nullInt(v int64) any {
	if v == 0 {
		return nil
	}
	return v
}

func nullIf(v int64, ok bool) any {
	if !ok {
		return nil
	}
	return v
}

// Claimed reports whether caller has a claim on key open at now: it is
// waiting for admission, so its reservation is not lent.
func (tx *Tx) Claimed(key, caller string, now time.Time) (bool, error) {
	var n int
	err := tx.q.QueryRowContext(tx.ctx, `SELECT count(*) FROM claims WHERE key = ? AND caller = ? AND until > ?`,
		key, caller, micros(now)).Scan(&n)
	return n > 0, err
}

// Claim opens (or extends) caller's claim on key until until.
func (tx *Tx) Claim(key, caller string, until time.Time) error {
	_, err := tx.q.ExecContext(tx.ctx, `INSERT INTO claims (key, caller, until) VALUES (?, ?, ?)
		ON CONFLICT (key, caller) DO UPDATE SET until = max(until, excluded.until)`, key, caller, micros(until))
	if err != nil {
		return fmt.Errorf("state: claim: %w", err)
	}
	return nil
}
