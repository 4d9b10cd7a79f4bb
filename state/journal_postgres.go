package state

import (
	"fmt"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// On PostgreSQL every statement is a round trip to the server, and the
// journal's applier records up to journalBatch outcomes a transaction:
// one statement at a time (the slot's state, the call, each observation)
// that was some 800 round trips, 50–700 ms on a loaded 2-core host — and
// past the transaction's bound (DefaultPostgresTimeout) when the host's
// CPU is scarce, so that the applier failed the same batch again and
// again while its journal grew. finishAll records a batch in two
// statements, whatever its size: the calls, and the observations of those
// it recorded; the observations wait for the transaction's next round
// trip.

// pgFinishSlots records the calls of reserved slots, each an element of
// the arrays ($1 their IDs), as FinishReserved does, where the slot is
// still reserved (or released by the sweep) and not recorded yet, and
// the ends of attempts admitted alone, as FinishAttempt does (their wait
// as admitted), where the attempt is still admitted (or interrupted by
// the sweep) (see Tx.finish); it returns the IDs of those it recorded. The slots are
// found by their IDs and each one's values by its ID's place in $1: a
// join to the arrays, planned on statistics that rarely know how many
// slots are reserved, rescanned them once for each slot (a batch took
// 50 ms), or walked every reserved and released slot once for each
// element (4,000 × 256 rows, 2 s, once a journal's backlog grew).
const pgFinishSlots = `UPDATE attempts AS a SET (call_id, attempt, caller, transport, method, target, digest, state, reason,
		wait_us, status, sent_at, answered_at, lease_until, why) =
	(SELECT ($3::text[])[i], ($4::bigint[])[i], ($5::text[])[i], ($6::text[])[i], ($7::text[])[i], ($8::text[])[i],
		($9::text[])[i], ($10::text[])[i], ($11::text[])[i], CASE WHEN a.call_id = '' THEN ($12::bigint[])[i] ELSE a.wait_us END,
		nullif(($13::bigint[])[i], 0), nullif(($14::bigint[])[i], 0), nullif(($15::bigint[])[i], 0), NULL::bigint,
		nullif(($16::text[])[i], '')
	FROM (SELECT array_position($1::bigint[], a.id) AS i) AS p)
	WHERE a.id = ANY($1::bigint[]) AND a.key = ($2::text[])[array_position($1::bigint[], a.id)] AND a.counted
		AND (a.call_id = '' AND a.state IN ('reserved', 'released')
			OR a.call_id = ($3::text[])[array_position($1::bigint[], a.id)]
				AND a.attempt = ($4::bigint[])[array_position($1::bigint[], a.id)] AND a.state IN ('admitted', 'interrupted'))
	RETURNING a.id`

// pgAddObservations records observations, each an element of the arrays,
// in their order, as AddObservation does; a value whose flag ($19…) is false
// is recorded as unknown.
const pgAddObservations = `INSERT INTO observations
	(key, attempt_id, policy, unit, partition, q, w_us, r, t_us, status, received_at, server_date,
	 shape, profile, guessed, from_cache, method, target)
	SELECT key, nullif(attempt_id, 0), policy, unit, partition, CASE WHEN has_q THEN q END, CASE WHEN has_w THEN w_us END,
		CASE WHEN has_r THEN r END, CASE WHEN has_t THEN t_us END, status, received_at, nullif(server_date, 0),
		shape, profile, guessed, from_cache, method, target
	FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[],
		$9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::text[], $14::text[], $15::boolean[], $16::boolean[],
		$17::text[], $18::text[], $19::boolean[], $20::boolean[], $21::boolean[], $22::boolean[])
		WITH ORDINALITY AS o(key, attempt_id, policy, unit, partition, q, w_us, r, t_us, status, received_at, server_date,
		shape, profile, guessed, from_cache, method, target, has_q, has_w, has_r, has_t, n)
	ORDER BY n`

// finishAll records fs in tx as finish records each, in order, and
// returns how many it recorded.
func (tx *Tx) finishAll(fs []ledger.Finished) (int, error) {
	if tx.pg == nil {
		return tx.finishEach(fs)
	}
	return tx.pgFinishAll(fs)
}

// finishEach is finishAll one statement an outcome, as SQLite records
// them.
func (tx *Tx) finishEach(fs []ledger.Finished) (int, error) {
	n := 0
	for _, f := range fs {
		ok, err := tx.finish(f)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// pgFinishAll is finishAll on PostgreSQL: the calls in one statement
// (pgFinishSlots), and the observations of those it recorded in another,
// which waits for the transaction's next round trip.
func (tx *Tx) pgFinishAll(fs []ledger.Finished) (int, error) {
	tx.pg.wrote("attempts")
	// An outcome a journal holds twice is recorded once, the first time:
	// the second finds its slot recorded.
	seen := make(map[int64]bool, len(fs))
	var s slotColumns
	for _, f := range fs {
		if !seen[f.Attempt.ID] {
			seen[f.Attempt.ID] = true
			if err := s.add(f.Attempt); err != nil {
				return 0, fmt.Errorf("state: finish reserved slots: %w", err)
			}
		}
	}
	rows, err := tx.pg.query(tx.ctx, pgFinishSlots, s.id, s.key, s.callID, s.attempt, s.caller, s.transport,
		s.method, s.target, s.digest, s.state, s.reason, s.wait, s.status, s.sent, s.answered, s.why)
	if err != nil {
		return 0, fmt.Errorf("state: finish reserved slots: %w", err)
	}
	recorded := make(map[int64]bool, len(fs))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("state: finish reserved slots: %w", err)
		}
		recorded[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("state: finish reserved slots: %w", err)
	}
	var o observationColumns
	for _, f := range fs {
		if recorded[f.Attempt.ID] && seen[f.Attempt.ID] {
			seen[f.Attempt.ID] = false // its first outcome's observations only
			for _, ob := range f.Observations {
				o.add(ob)
			}
		}
	}
	if len(o.key) > 0 { // with the transaction's next round trip: its COMMIT, as a rule
		tx.pg.later("record observations", pgAddObservations, o.key, o.attemptID, o.policy, o.unit, o.partition,
			o.q, o.w, o.r, o.t, o.status, o.received, o.date, o.shape, o.profile, o.guessed, o.fromCache, o.method,
			o.target, o.hasQ, o.hasW, o.hasR, o.hasT)
	}
	return len(recorded), nil
}

// slotColumns are the columns of pgFinishSlots, an element per slot.
type slotColumns struct {
	id, attempt, wait, status, sent, answered                             []int64
	key, callID, caller, transport, method, target, digest, state, reason []string
	why                                                                   []string // "" for none
}

func (c *slotColumns) add(a ledger.Attempt) error {
	why, err := keep(a.Reason)
	if err != nil {
		return err
	}
	c.id = append(c.id, a.ID)
	c.key = append(c.key, a.Key)
	c.callID = append(c.callID, a.CallID)
	c.attempt = append(c.attempt, int64(a.Attempt))
	c.caller = append(c.caller, a.Caller)
	c.transport = append(c.transport, string(a.Transport))
	c.method = append(c.method, a.Method)
	c.target = append(c.target, a.Target)
	c.digest = append(c.digest, a.Digest)
	c.state = append(c.state, string(a.State))
	c.reason, c.why = append(c.reason, why.words), append(c.why, why.why.String)
	c.wait = append(c.wait, a.Wait.Microseconds())
	c.status = append(c.status, int64(a.Status))
	c.sent = append(c.sent, micros(a.SentAt))
	c.answered = append(c.answered, micros(a.AnsweredAt))
	return nil
}

// observationColumns are the columns of pgAddObservations, an element
// per observation.
type observationColumns struct {
	attemptID, q, w, r, t, status, received, date                []int64
	guessed, fromCache, hasQ, hasW, hasR, hasT                   []bool
	key, policy, unit, partition, shape, profile, method, target []string
}

func (c *observationColumns) add(o ledger.ObservationRecord) {
	c.key = append(c.key, o.Key)
	c.attemptID = append(c.attemptID, o.AttemptID)
	c.policy = append(c.policy, o.Policy)
	c.unit = append(c.unit, string(o.Unit))
	c.partition = append(c.partition, o.Partition)
	c.q, c.hasQ = append(c.q, o.Quota), append(c.hasQ, o.HasQuota)
	c.w, c.hasW = append(c.w, o.Window.Microseconds()), append(c.hasW, o.Window > 0)
	c.r, c.hasR = append(c.r, o.Remaining), append(c.hasR, o.HasRemaining)
	c.t, c.hasT = append(c.t, o.Reset.Microseconds()), append(c.hasT, o.HasReset)
	c.status = append(c.status, int64(o.Status))
	c.received = append(c.received, micros(o.ReceivedAt))
	c.date = append(c.date, micros(o.ServerDate))
	c.shape = append(c.shape, string(o.Shape))
	c.profile = append(c.profile, string(o.Profile))
	c.guessed = append(c.guessed, o.Guessed)
	c.fromCache = append(c.fromCache, o.FromCache)
	c.method = append(c.method, o.Method)
	c.target = append(c.target, o.Target)
}
