// Package sqlite holds the state's SQL on SQLite: the statements the
// package state prepares, by name, and the schema's migrations.
package sqlite

import "embed"

// Statements are the state's SQL statements on SQLite, by name: the
// package state prepares each by its name (state's newQuery), and a test
// checks that both back ends have the same names. Parameters are ? or ?N.
// Planner hints are SQLite's own: +key keeps the planner from every index
// on the key where a lease's slots are found by their IDs, and INDEXED BY
// names the index a walk of the activity or of the sweep takes. Flags
// are 0 or 1; times are microseconds since the Unix epoch, durations
// microseconds (the columns named *_us).
var Statements = map[string]string{
	// fair
	"LastPrincipalSend": `SELECT pseq FROM attempts WHERE key = ? AND principal = ? AND pseq IS NOT NULL
	ORDER BY at DESC, pseq DESC LIMIT 1`,
	"NumberPrincipal": `UPDATE attempts SET principal = ?, pseq = ? WHERE id = ?`,
	"PrincipalSends": `SELECT f.pseq, f.at,
		(SELECT pseq FROM attempts WHERE key = ?1 AND principal = ?2 AND pseq IS NOT NULL
		ORDER BY at DESC, pseq DESC LIMIT 1)
	FROM attempts AS f WHERE f.key = ?1 AND f.principal = ?2 AND f.pseq IS NOT NULL AND f.at > ?3
	ORDER BY f.at, f.pseq LIMIT 1`,
	"Waiting":       `SELECT DISTINCT principal FROM waiters WHERE key = ? AND until > ? AND until <= ?`,
	"ForgetWaiters": `DELETE FROM waiters WHERE key = ? AND until <= ? AND until >= ?`,
	"SweepWaiters":  `DELETE FROM waiters WHERE until <= ? AND until >= ?`,
	"Wait": `INSERT INTO waiters (key, principal, waiter, since, until) VALUES (?, ?, ?, ?, ?)
	ON CONFLICT (key, principal, waiter) DO UPDATE SET until = excluded.until`,
	// fill
	"FillHistory": `WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?15 - 1)
	INSERT INTO attempts (call_id, attempt, key, caller, transport, method, target, digest, state, reason,
		probe, counted, at, wait_us, seq, instance, bytes, cbytes, status, sent_at, answered_at, why)
	SELECT 'h' || i, 1, json_extract(?1, '$[' || (i % ?2) || ']'), ?3, ?4, ?5, ?6, '', ?7, ?8,
		0, 1, ?9 + i * ?10, 0, i / ?2 + 1, ?11, 0, 0, ?12, ?9 + i * ?10, ?9 + i * ?10 + ?13, ?14
	FROM n ORDER BY i`,
	// journal
	"OpenState": `SELECT state, call_id, attempt FROM attempts WHERE id = ? AND key = ?`,
	// lease
	"Reserve": `WITH RECURSIVE slot(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM slot WHERE i < ?1)
	INSERT INTO attempts (call_id, attempt, key, caller, transport, method, target, digest, state, reason,
		probe, counted, at, wait_us, lease_until, seq, instance, cbytes, why)
	SELECT '', 0, ?2, '', '', '', '', '', ?3, ?4, 0, 1, ?5, 0, ?6, ?7 + i, ?8, ?9, ?10 FROM slot ORDER BY i RETURNING id`,
	"ReservedCount": `SELECT count(*) FROM attempts WHERE +key = ? AND id BETWEEN ? AND ? AND state = 'reserved'`,
	"FinishReserved": `UPDATE attempts SET call_id = ?1, attempt = ?2, caller = ?3, transport = ?4, method = ?5,
	target = ?6, digest = ?7, state = ?8, reason = ?9, wait_us = ?10, status = ?11, sent_at = ?12, answered_at = ?13, lease_until = NULL,
	why = ?15 WHERE id = ?14 AND counted = 1`,
	"DropReserved": `DELETE FROM attempts WHERE +key = ? AND id BETWEEN ? AND ? AND state = 'reserved'`,
	"LastReserved": `SELECT coalesce(max(seq), 0) FROM attempts
	WHERE +key = ? AND id BETWEEN ? AND ? AND counted = 1`,
	"ReleaseReserved": `UPDATE attempts SET state = 'released', lease_until = NULL, reason = ?1, why = ?5
	WHERE +key = ?2 AND id BETWEEN ?3 AND ?4 AND state = 'reserved'`,
	// policies
	"SeenPolicies": `SELECT policy, unit, partition, q, w_us, r, t_us,
	received_at, basis_at, source, hidden, route FROM policies WHERE key = ? ORDER BY policy, unit, partition`,
	"PutSeenPolicy": `INSERT INTO policies
	(key, policy, unit, partition, q, w_us, r, t_us, received_at, basis_at, source, hidden, route)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (key, policy, unit, partition) DO UPDATE SET
		q = coalesce(excluded.q, policies.q), w_us = coalesce(excluded.w_us, policies.w_us),
		r           = CASE WHEN excluded.r IS NULL THEN policies.r ELSE excluded.r END,
		t_us        = CASE WHEN excluded.r IS NULL THEN policies.t_us ELSE excluded.t_us END,
		received_at = CASE WHEN excluded.r IS NULL AND excluded.hidden = 0 THEN policies.received_at ELSE excluded.received_at END,
		basis_at    = CASE WHEN excluded.r IS NULL AND excluded.hidden = 0 THEN policies.basis_at ELSE excluded.basis_at END,
		route       = CASE WHEN excluded.r IS NULL AND excluded.hidden = 0 THEN policies.route ELSE excluded.route END,
		source = excluded.source, hidden = excluded.hidden`,
	"DeleteSeenPolicy": `DELETE FROM policies WHERE key = ? AND policy = ? AND unit = ? AND partition = ?`,
	"AddObservation": `INSERT INTO observations
	(key, attempt_id, policy, unit, partition, q, w_us, r, t_us, status, received_at, server_date,
	 shape, profile, guessed, from_cache, method, target)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	"Observations": `SELECT id, coalesce(attempt_id, 0), policy, unit, partition, q, w_us, r, t_us,
	status, received_at, coalesce(server_date, 0), shape, profile, guessed, from_cache, method, target
	FROM observations WHERE key = ? ORDER BY id DESC LIMIT ?`,
	"Gates": `SELECT scope, until, reason, why, source, set_at FROM gates
	WHERE key = ? AND until > ? ORDER BY until DESC`,
	"PutGate": `INSERT INTO gates (key, scope, until, reason, why, source, set_at)
	VALUES (?1, ?2, ?3, ?7, ?4, ?5, ?6)
	ON CONFLICT (key, scope) DO UPDATE SET until = excluded.until, reason = excluded.reason, why = excluded.why,
		source = excluded.source, set_at = excluded.set_at
	WHERE excluded.until > gates.until`,
	"KeyState": `SELECT last_admit_at, interval_us, last_response_at, failures, opens,
	half_open, probe_attempt, probe_until, latency_us, prev_latency_us, latency_since FROM key_state WHERE key = ?`,
	"PutKeyState": `INSERT INTO key_state
	(key, last_admit_at, interval_us, last_response_at, failures, opens, half_open, probe_attempt, probe_until,
	 latency_us, prev_latency_us, latency_since)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (key) DO UPDATE SET last_admit_at = excluded.last_admit_at, interval_us = excluded.interval_us,
		last_response_at = excluded.last_response_at, failures = excluded.failures, opens = excluded.opens,
		half_open = excluded.half_open, probe_attempt = excluded.probe_attempt, probe_until = excluded.probe_until,
		latency_us = excluded.latency_us, prev_latency_us = excluded.prev_latency_us, latency_since = excluded.latency_since`,
	"PathState": `SELECT failures, opens, half_open, last_at FROM path_failures WHERE key = ? AND scope = ?`,
	"PutPathState": `INSERT INTO path_failures (key, scope, failures, opens, half_open, last_at)
	VALUES (?, ?, ?, ?, ?, ?)
	ON CONFLICT (key, scope) DO UPDATE SET failures = excluded.failures, opens = excluded.opens,
		half_open = excluded.half_open, last_at = excluded.last_at`,
	"FailingPaths":    `SELECT count(*) FROM path_failures WHERE key = ? AND last_at > ?`,
	"ForgetPaths":     `DELETE FROM path_failures WHERE key = ? AND last_at < ?`,
	"ForgetPathGates": `DELETE FROM gates WHERE key = ? AND scope != '' AND until < ?`,
	"AddWarning":      `INSERT INTO warnings (key, at, kind, message, why) VALUES (?1, ?2, ?3, ?5, ?4)`,
	"Warnings": `SELECT id, at, kind, message, why FROM warnings
	WHERE key = ? AND at > ? AND at <= ? ORDER BY id DESC LIMIT 20`,
	"Warned": `SELECT EXISTS (SELECT 1 FROM warnings WHERE key = ?1 AND kind = ?2 AND at > ?3 AND at <= ?4)`,
	// responses
	"Response": `SELECT etag, last_modified, status, content_type, body, digest, stored_at, unchanged, vary, varied
	FROM responses WHERE key = ? AND target = ?`,
	"PutResponse": `INSERT INTO responses
	(key, target, etag, last_modified, status, content_type, body, digest, stored_at, unchanged, vary, varied)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (key, target) DO UPDATE SET etag = excluded.etag, last_modified = excluded.last_modified,
		status = excluded.status, content_type = excluded.content_type, body = excluded.body,
		digest = excluded.digest, stored_at = excluded.stored_at, unchanged = excluded.unchanged,
		vary = excluded.vary, varied = excluded.varied
	WHERE excluded.stored_at >= responses.stored_at`,
	"StoredTargets": `SELECT target FROM responses WHERE key = ? ORDER BY stored_at DESC`,
	"DropResponse":  `DELETE FROM responses WHERE key = ? AND target = ?`,
	"Keys":          `SELECT key FROM key_state UNION SELECT key FROM policies ORDER BY 1`,
	"Claimed":       `SELECT caller FROM claims WHERE key = ? AND until > ?`,
	"Claim": `INSERT INTO claims (key, caller, until) VALUES (?, ?, ?)
	ON CONFLICT (key, caller) DO UPDATE SET until = max(until, excluded.until)`,
	// signing
	"AddSigningKey": `INSERT INTO signing_keys (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`,
	"SigningKey":    `SELECT value FROM signing_keys WHERE name = ?`,
	// sweep
	"SweepInterrupted": `UPDATE attempts SET
	state = CASE state WHEN 'reserved' THEN 'released' ELSE 'interrupted' END, lease_until = NULL,
	reason = CASE state WHEN 'reserved' THEN ?2 ELSE ?3 END, why = CASE state WHEN 'reserved' THEN ?4 ELSE ?5 END
	WHERE lease_until IS NOT NULL AND lease_until <= ?1`,
	"SweepAttempts": `DELETE FROM attempts WHERE id IN (SELECT id FROM attempts INDEXED BY attempts_at
	WHERE at < ? AND lease_until IS NULL ORDER BY at LIMIT ?)`,
	"SweepObservations": `DELETE FROM observations WHERE id IN (SELECT id FROM observations INDEXED BY observations_received
	WHERE received_at < ? ORDER BY received_at LIMIT ?)`,
	"SweepWarnings": `DELETE FROM warnings WHERE id IN (SELECT id FROM warnings INDEXED BY warnings_at
	WHERE at < ? ORDER BY at LIMIT ?)`,
	"SweptAround": `SELECT DISTINCT key FROM attempts INDEXED BY attempts_at WHERE at < ? AND at >= ? AND counted = 1`,
	"FreePages":   `SELECT freelist_count FROM pragma_freelist_count`,
	"AutoVacuum":  `SELECT auto_vacuum FROM pragma_auto_vacuum`,
	// timeline
	"Timeline": `SELECT (coalesce(nullif(sent_at, 0), at) - ?2) / ?3 AS b, state,
		CASE WHEN state = 'rejected_upstream' THEN coalesce(status, 0) ELSE 0 END AS st, count(*) FROM attempts
	WHERE key = ?1 AND coalesce(nullif(sent_at, 0), at) >= ?2 AND state != 'reserved'
	GROUP BY b, state, st ORDER BY b, state, st`,
	"Call": `SELECT id, call_id, attempt, key, caller, transport, method, target,
	digest, state, CASE WHEN why IS NULL THEN reason ELSE '' END, why, probe, at, wait_us, coalesce(sent_at, 0), coalesce(answered_at, 0), coalesce(status, 0),
	coalesce(lease_until, 0), instance
	FROM attempts WHERE key = ? AND call_id = ? AND call_id != '' AND state != 'reserved' ORDER BY attempt, id`,
	"ObservationsOf": `SELECT id, coalesce(attempt_id, 0), policy, unit, partition, q, w_us, r, t_us,
	status, received_at, coalesce(server_date, 0), shape, profile, guessed, from_cache, method, target
	FROM observations WHERE key = ? AND attempt_id = ? ORDER BY id`,
	// tx
	"InsertAttempt": `INSERT INTO attempts
	(call_id, attempt, key, caller, transport, method, target, digest, state, reason, probe, counted, at, wait_us, lease_until, seq, cseq,
	 instance, bytes, cbytes, why)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
	"LastSend": `SELECT seq, at, coalesce(cbytes, 0) FROM attempts WHERE key = ? AND counted = 1 ORDER BY at DESC, seq DESC LIMIT 1`,
	"LastCallerSend": `SELECT cseq FROM attempts WHERE key = ? AND caller = ? AND cseq IS NOT NULL
	ORDER BY at DESC, cseq DESC LIMIT 1`,
	"Renumber": `UPDATE attempts SET seq = o.n, cseq = o.c, cbytes = o.b
	FROM (SELECT id, row_number() OVER (ORDER BY at, id) AS n, sum(bytes) OVER (ORDER BY at, id) AS b,
		CASE WHEN cseq IS NOT NULL THEN row_number() OVER (PARTITION BY caller, cseq IS NULL ORDER BY at, id) END AS c
		FROM attempts WHERE key = ?1 AND counted = 1 AND at >= ?2 AND at <= ?3) AS o
	WHERE attempts.id = o.id`,
	"FinishAttempt": `UPDATE attempts
	SET state = ?1, reason = ?2, status = ?3, sent_at = ?4, answered_at = ?5, lease_until = NULL, why = ?7 WHERE id = ?6`,
	"FirstSend": `SELECT f.seq, f.at,
		(SELECT seq FROM attempts WHERE key = ?1 AND counted = 1 ORDER BY at DESC, seq DESC LIMIT 1)
	FROM attempts AS f WHERE f.key = ?1 AND f.counted = 1 AND f.at > ?2 ORDER BY f.at, f.seq LIMIT 1`,
	"WindowByCaller": `SELECT caller, count(*), min(at) FROM attempts
	WHERE key = ? AND at > ? AND at <= ? AND counted = 1 GROUP BY caller`,
	"CallerSends": `SELECT f.cseq, f.at,
		(SELECT cseq FROM attempts WHERE key = ?1 AND caller = ?2 AND cseq IS NOT NULL
		ORDER BY at DESC, cseq DESC LIMIT 1)
	FROM attempts AS f WHERE f.key = ?1 AND f.caller = ?2 AND f.cseq IS NOT NULL AND f.at > ?3
	ORDER BY f.at, f.cseq LIMIT 1`,
	"Nth": `SELECT at FROM attempts WHERE key = ? AND at > ? AND counted = 1 ORDER BY at LIMIT 1 OFFSET ?`,
	"FirstBytes": `SELECT coalesce(f.cbytes, 0) - f.bytes,
		(SELECT coalesce(cbytes, 0) FROM attempts WHERE key = ?1 AND counted = 1 ORDER BY at DESC, seq DESC LIMIT 1)
	FROM attempts AS f WHERE f.key = ?1 AND f.counted = 1 AND f.at > ?2 ORDER BY f.at, f.seq LIMIT 1`,
	"ByteAt": `SELECT at FROM attempts WHERE key = ? AND counted = 1 AND bytes > 0 AND cbytes >= ?
	ORDER BY cbytes, seq LIMIT 1`,
	"Sends": `SELECT id, at, state, coalesce(status, 0), coalesce(answered_at, 0) FROM attempts
	WHERE key = ? AND at > ? AND counted = 1 ORDER BY at DESC, seq DESC LIMIT ?`,
	"InFlight": `SELECT count(*), coalesce(min(at), 0) FROM attempts
	WHERE key = ? AND lease_until IS NOT NULL AND lease_until > ?`,
	"InFlightExcept": `SELECT count(*), coalesce(min(at), 0) FROM attempts
	WHERE key = ?1 AND lease_until IS NOT NULL AND lease_until > ?2 AND id NOT IN (SELECT value FROM json_each(?3))`,
	"Latest": `SELECT max(at) FROM attempts WHERE key = ? AND counted = 1`,
	"ActivityKey": `SELECT id, call_id, attempt, key, caller, transport, method, target,
	digest, state, CASE WHEN why IS NULL THEN reason ELSE '' END, why, probe, at, wait_us, coalesce(sent_at, 0), coalesce(answered_at, 0), coalesce(status, 0),
	coalesce(lease_until, 0), instance FROM attempts INDEXED BY attempts_key_at
	WHERE key = ?1 AND at >= ?2 AND (at, id) < (coalesce((SELECT at FROM attempts WHERE id = ?3), ?4), ?3)
	AND state != 'reserved' ORDER BY at DESC, id DESC LIMIT ?5`,
	"ActivityAll": `SELECT id, call_id, attempt, key, caller, transport, method, target,
	digest, state, CASE WHEN why IS NULL THEN reason ELSE '' END, why, probe, at, wait_us, coalesce(sent_at, 0), coalesce(answered_at, 0), coalesce(status, 0),
	coalesce(lease_until, 0), instance FROM attempts INDEXED BY attempts_at
	WHERE at >= ?2 AND (at, id) < (coalesce((SELECT at FROM attempts WHERE id = ?3), ?4), ?3)
	AND state != 'reserved' AND ?1 = '' ORDER BY at DESC, id DESC LIMIT ?5`,
	"Repeats": `SELECT count(*) FROM attempts
	WHERE key = ? AND caller = ? AND digest = ? AND digest != '' AND at > ? AND attempt <= 1`,
}

// Migrations are the schema's migrations on SQLite, NNNN_name.sql,
// applied in the order of their numbers; the newest is the version
// (PRAGMA user_version) this program writes.
//
//go:embed *.sql
var Migrations embed.FS
