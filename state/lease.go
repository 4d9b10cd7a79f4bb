package state

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A lease lets one process admit a batch of calls without a transaction
// each: Reserve records its slots as attempts admitted at once, counted
// against the key's budgets and in flight for every process from then
// on; the process hands them out in memory, reports each one's call and
// outcome with FinishReserved, and gives back the slots it never handed
// out with Release. A slot stays counted as sent whatever its end, so
// a process that dies with a lease has spent no more than it held.

// maxReserve is the most slots one Reserve records: a block of attempt
// IDs on PostgreSQL.
const maxReserve = 1024

// The reasons the state gives the attempts it ends itself.
var (
	// releasedByEnd is the reason of a slot whose process ended holding it.
	releasedByEnd = mustKeep(reason.Reason{Kind: reason.Unreported})
	// interruptedByEnd is the reason of an attempt whose process ended
	// before its answer was recorded.
	interruptedByEnd = mustKeep(reason.Reason{Kind: reason.Interrupted})
	// releasedUnneeded is the reason of a slot given back unused, after
	// later admissions.
	releasedUnneeded = mustKeep(reason.Reason{Kind: reason.Unneeded})
	// reservedSlot is the reason of a slot not handed out yet.
	reservedSlot = mustKeep(reason.Reason{Kind: reason.Reserved})
)

// A lease's slots are found by their IDs, a range of the table itself:
// "+key" keeps SQLite from walking the key's index instead.
var (
	// On PostgreSQL the IDs of one INSERT are consecutive only when they
	// come from one block (see the schema's attempt_blocks).
	qReserve       = newQuery("Reserve")
	qReservedCount = newQuery("ReservedCount")
)

// Reserve records n slots of key admitted at at, each in flight until
// inFlightUntil, and returns the first and last of their IDs
// (consecutive). They must not be recorded before the key's latest
// admission: the pacer reserves in order of time.
func (tx *Tx) Reserve(key string, n int, at, inFlightUntil time.Time) (first, last int64, err error) {
	if err := tx.admits(key); err != nil {
		return 0, 0, fmt.Errorf("state: reserve: %w", err)
	}
	var seq, lastAt, cbytes int64 // a slot carries no bytes it knows of
	err = tx.queryRow(qLastSend, key).Scan(&seq, &lastAt, &cbytes)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, 0, fmt.Errorf("state: reserve: %w", err)
	}
	if micros(at) < lastAt {
		return 0, 0, fmt.Errorf("state: reserve: slots at %v would precede the key's latest admission", at)
	}
	if n < 1 || n > maxReserve {
		return 0, 0, fmt.Errorf("state: reserve: %d slots: a lease holds 1 to %d", n, maxReserve)
	}
	rows, err := tx.query(qReserve, n, key, ledger.Reserved, reservedSlot.words, micros(at), micros(inFlightUntil), seq, tx.instance, cbytes, reservedSlot.why)
	if err != nil {
		return 0, 0, fmt.Errorf("state: reserve: %w", err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("state: reserve: %w", err)
		}
		if first == 0 || id < first {
			first = id
		}
		last = max(last, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("state: reserve: %w", err)
	}
	var got int64
	if err := tx.queryRow(qReservedCount, key, first, last).Scan(&got); err != nil || got != int64(n) {
		return 0, 0, fmt.Errorf("state: reserve: slots %d…%d are not the %d just recorded (%v)", first, last, n, err)
	}
	return first, last, nil
}

var qFinishReserved = newQuery("FinishReserved")

// FinishReserved records the call a reserved slot was handed to and how
// it ended (a's ID, call, state, reason, status and times), and ends its
// time in flight.
func (tx *Tx) FinishReserved(a ledger.Attempt) error {
	why, err := keep(a.Reason)
	if err != nil {
		return fmt.Errorf("state: finish reserved slot: %w", err)
	}
	res, err := tx.exec(qFinishReserved, a.CallID, a.Attempt, a.Caller, string(a.Transport), a.Method, a.Target, a.Digest,
		string(a.State), why.words, a.Wait.Microseconds(), nullInt(int64(a.Status)), nullInt(micros(a.SentAt)),
		nullInt(micros(a.AnsweredAt)), a.ID, why.why)
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n != 1 {
			err = fmt.Errorf("slot %d is not recorded", a.ID)
		}
	}
	if err != nil {
		return fmt.Errorf("state: finish reserved slot: %w", err)
	}
	return nil
}

var (
	qDropReserved    = newQuery("DropReserved")
	qLastReserved    = newQuery("LastReserved")
	qReleaseReserved = newQuery("ReleaseReserved")
)

// Release gives back key's reserved slots first…last, none of which was
// handed out. When they are the latest of the key's log they are deleted,
// as if never reserved; otherwise (another admission came after them) they
// stay counted, as released: the log's numbering has no gaps.
func (tx *Tx) Release(key string, first, last int64) error {
	if first > last {
		return nil
	}
	var top, topAt, topBytes, mine int64
	if err := tx.queryRow(qLastSend, key).Scan(&top, &topAt, &topBytes); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("state: release: %w", err)
	}
	if err := tx.queryRow(qLastReserved, key, first, last).Scan(&mine); err != nil {
		return fmt.Errorf("state: release: %w", err)
	}
	var err error
	if mine == top {
		_, err = tx.exec(qDropReserved, key, first, last)
	} else {
		_, err = tx.exec(qReleaseReserved, releasedUnneeded.words, key, first, last, releasedUnneeded.why)
	}
	if err != nil {
		return fmt.Errorf("state: release: %w", err)
	}
	return nil
}
