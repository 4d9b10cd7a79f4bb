package state

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A Tx is one transaction on the state file, from DB.Update (read-write)
// or DB.View (read-only). It is not safe for concurrent use and must not
// be kept after the function it was passed to returns.
type Tx struct {
	tx    *sql.Tx     // a View's transaction; nil in an Update, which runs on the writer's connection
	stmts *statements // the DB's statements, on the readers or on the writer's connection
	ctx   context.Context
	pg    *pgTx // on PostgreSQL: what the transaction holds; nil on SQLite

	instance string // the process recording attempts (Attempt.Instance)
	// out is the process's journal of outcomes (see FinishLater): the
	// attempts whose end it holds, not yet recorded, are no longer in
	// flight for this process. nil when there is none.
	out *outcomes
}

var (
	_ ledger.Tx     = (*Tx)(nil)
	_ ledger.ReadTx = (*Tx)(nil)
	_ ledger.Store  = (*DB)(nil)
	_ ledger.Store  = (*Postgres)(nil)
)

// Clock returns local on SQLite, whose processes share the host's
// clock, and the server's clock on PostgreSQL (see Postgres).
func (tx *Tx) Clock(local time.Time) time.Time {
	if tx.pg != nil {
		return tx.pg.clock(tx, local)
	}
	return local
}

// hold makes sure tx holds key: on SQLite every write transaction holds
// every key; on PostgreSQL the key's row is locked, when Update did not
// lock it before fn (the sweep's renumbering).
func (tx *Tx) hold(key string) error {
	if tx.pg == nil {
		return nil
	}
	return tx.pg.hold(tx, key)
}

// admits checks that tx may record an admission of key: that it held key
// before reading what the admission was decided on.
func (tx *Tx) admits(key string) error {
	if tx.pg == nil || tx.pg.held[key] {
		return nil
	}
	return fmt.Errorf("an admission of %q in a transaction that does not hold it (pass the key to Update)", key)
}

// stmt returns the prepared statement q, bound to the transaction.
func (tx *Tx) stmt(q query) (*sql.Stmt, error) {
	s, err := tx.stmts.get(tx.ctx, q)
	if err != nil || tx.tx == nil {
		return s, err
	}
	return tx.tx.StmtContext(tx.ctx, s), nil
}

// pgText returns q as PostgreSQL writes it.
func pgText(q query) (string, error) {
	if queries[q].postgres == "" {
		return "", fmt.Errorf("state: PostgreSQL has no statement %s", queries[q].name)
	}
	return queries[q].postgres, nil
}

// write runs a statement whose answer the transaction does not need. On
// PostgreSQL it waits to go with the transaction's next round trip (see
// pgTx.later), where a failure fails the transaction as what.
func (tx *Tx) write(what string, q query, args ...any) error {
	if tx.pg == nil {
		_, err := tx.exec(q, args...)
		return err
	}
	text, err := pgText(q)
	if err != nil {
		return err
	}
	tx.pg.later(what, text, args...)
	return nil
}

func (tx *Tx) exec(q query, args ...any) (sql.Result, error) {
	if tx.pg != nil {
		tx.pg.ran(q)
		text, err := pgText(q)
		if err != nil {
			return nil, err
		}
		return tx.pg.exec(tx.ctx, text, args...)
	}
	s, err := tx.stmt(q)
	if err != nil {
		return nil, err
	}
	return s.ExecContext(tx.ctx, args...)
}

func (tx *Tx) query(q query, args ...any) (*sql.Rows, error) {
	if tx.pg != nil {
		tx.pg.ran(q)
		text, err := pgText(q)
		if err != nil {
			return nil, err
		}
		return tx.pg.query(tx.ctx, text, args...)
	}
	s, err := tx.stmt(q)
	if err != nil {
		return nil, err
	}
	return s.QueryContext(tx.ctx, args...)
}

// row is a *sql.Row, or the error that kept its statement from running.
type row struct {
	r   *sql.Row
	err error
}

// Scan is sql.Row's Scan, or the error that kept the statement from running.
func (r row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.r.Scan(dest...)
}

func (tx *Tx) queryRow(q query, args ...any) row {
	if tx.pg != nil {
		tx.pg.ran(q)
		text, err := pgText(q)
		if err != nil {
			return row{err: err}
		}
		return tx.pg.queryRow(tx.ctx, text, args...)
	}
	s, err := tx.stmt(q)
	if err != nil {
		return row{err: err}
	}
	return row{r: s.QueryRowContext(tx.ctx, args...)}
}

var (
	qInsertAttempt  = newQuery("InsertAttempt")
	qLastSend       = newQuery("LastSend")
	qLastCallerSend = newQuery("LastCallerSend")
	// Numbered again: every admission in the key's log, and those in a
	// caller's log among that caller's (the times between ?2 and ?3: all
	// of them, see noEarlier).
	qRenumber = newQuery("Renumber")
)

// noEarlier and noLater close the ranges of times that statements read
// through an index but mean open: no time the state records is outside
// them. PostgreSQL may plan a prepared statement once for any parameters
// (a generic plan, which the connection then keeps), and estimates a range
// bounded by a parameter on one side at a third of the table, which it
// reads whole, and on both sides at half a percent, which it reads
// through the index (BenchmarkPostgresPlans checks every statement).
const (
	noEarlier = math.MinInt64
	noLater   = math.MaxInt64
)

// InsertAttempt records a and returns its ID. An attempt recorded as
// Admitted counts against its key's budget from then on, whatever its end.
//
// The key's admitted attempts are numbered in the order of their times
// (seq; see Window). An admission recorded after a later one (the pacer
// never does this: it records admissions in order) renumbers the key's
// log, at a cost that grows with it.
func (tx *Tx) InsertAttempt(a ledger.Attempt) (int64, error) {
	var lease, seq, cseq, cbytes any
	own := ownedAttempt{key: a.Key, counted: a.State == ledger.Admitted, at: micros(a.At)}
	if !a.InFlightUntil.IsZero() {
		lease, own.until = micros(a.InFlightUntil), micros(a.InFlightUntil)
	}
	renumber := false
	if a.State == ledger.Admitted {
		if err := tx.admits(a.Key); err != nil {
			return 0, fmt.Errorf("state: record attempt: %w", err)
		}
		var last, lastAt, lastBytes int64
		var err error
		if seq, at, bytes, found, ok := tx.pg.readLastSend(a.Key); !ok {
			err = tx.queryRow(qLastSend, a.Key).Scan(&last, &lastAt, &lastBytes)
		} else if found {
			last, lastAt, lastBytes = seq, at, bytes
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("state: record attempt: %w", err)
		}
		own.seq, own.bytes, renumber = last+1, lastBytes+max(a.Bytes, 0), micros(a.At) < lastAt
		seq, cbytes = own.seq, own.bytes
		if a.CallerReserves && a.Caller != "" {
			var lastOfCaller int64
			err := tx.queryRow(qLastCallerSend, a.Key, a.Caller).Scan(&lastOfCaller)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return 0, fmt.Errorf("state: record attempt: %w", err)
			}
			cseq = lastOfCaller + 1
		}
	}
	why, err := keep(a.Reason)
	if err != nil {
		return 0, fmt.Errorf("state: record attempt: %w", err)
	}
	args := []any{a.CallID, a.Attempt, a.Key, a.Caller, string(a.Transport), a.Method, a.Target, a.Digest, string(a.State), why.words,
		a.Probe, a.State == ledger.Admitted, micros(a.At), a.Wait.Microseconds(), lease, seq, cseq, tx.instance,
		max(a.Bytes, 0), cbytes, why.why}
	// On PostgreSQL the INSERT goes with the next round trip, under the
	// ID the transaction took beforehand (see insertAttemptLater).
	id, later := tx.pg.insertAttemptLater(args, own)
	if !later {
		if err := tx.queryRow(qInsertAttempt, args...).Scan(&id); err != nil {
			return 0, fmt.Errorf("state: record attempt: %w", err)
		}
	}
	if a.Principal != "" && a.State == ledger.Admitted {
		if err := tx.numberPrincipal(id, a); err != nil {
			return 0, fmt.Errorf("state: record attempt: %w", err)
		}
	}
	if renumber {
		if err := tx.renumber(a.Key); err != nil {
			return 0, fmt.Errorf("state: record attempt: %w", err)
		}
	}
	return id, nil
}

// renumber numbers key's admitted attempts 1, 2, … again, in the order of
// (at, id).
func (tx *Tx) renumber(key string) error {
	if err := tx.hold(key); err != nil {
		return err
	}
	_, err := tx.exec(qRenumber, key, int64(noEarlier), int64(noLater))
	return err
}

var qFinishAttempt = newQuery("FinishAttempt")

// FinishAttempt records how attempt id ended and ends its time in flight.
func (tx *Tx) FinishAttempt(id int64, state ledger.State, r reason.Reason, status int, sentAt, answeredAt time.Time) error {
	why, err := keep(r)
	args := []any{string(state), why.words, nullInt(int64(status)), nullInt(micros(sentAt)), nullInt(micros(answeredAt)), id, why.why}
	switch {
	case err != nil:
	case tx.pg == nil:
		err = tx.write("finish attempt", qFinishAttempt, args...)
	default:
		// What the pipeline read holds but for the attempt's time in
		// flight, which finished takes out.
		var text string
		if text, err = pgText(qFinishAttempt); err == nil {
			tx.pg.finished(id)
			tx.pg.queue("finish attempt", text, args...)
		}
	}
	if err != nil {
		return fmt.Errorf("state: finish attempt: %w", err)
	}
	return nil
}

// The sliding-window log is read through the numbers of a key's admitted
// attempts: seq runs 1, 2, … without gaps in the order of (at, id), so the
// attempts admitted after a time are those from the first of them to the
// key's last, and their count is the difference of two numbers, each found
// by one seek in the log's index, however long the window. qFirstSend
// reads the first attempt of key (?1) after a time (?2), with the key's
// last number.
var qFirstSend = newQuery("FirstSend")

// firstSend returns the number and time of key's first attempt admitted
// after since and the number of its last; ok is false when there is none.
func (tx *Tx) firstSend(key string, since time.Time) (seq, at, last int64, ok bool, err error) {
	if w, found := tx.pg.readFirstSend(key, micros(since)); found { // PostgreSQL: read once a transaction
		return w.seq, w.at, w.last, w.ok, nil
	}
	err = tx.queryRow(qFirstSend, key, micros(since)).Scan(&seq, &at, &last)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	ok = err == nil && last > 0
	if err == nil {
		tx.pg.keepFirstSend(key, micros(since), pgFirstSend{seq, at, last, ok})
	}
	return seq, at, last, ok, err
}

// Count returns how many attempts of key were admitted after since (the
// sliding-window log). Its cost does not grow with the count.
func (tx *Tx) Count(key string, since time.Time) (int, error) {
	seq, _, last, ok, err := tx.firstSend(key, since)
	if !ok {
		return 0, err
	}
	return int(last - seq + 1), nil
}

// Window returns how many attempts of key were admitted after since and
// the oldest of them (leaving ByCaller nil), in one read whose cost does
// not grow with the count.
func (tx *Tx) Window(key string, since time.Time) (ledger.Window, error) {
	seq, at, last, ok, err := tx.firstSend(key, since)
	if !ok {
		if err != nil {
			err = fmt.Errorf("state: window: %w", err)
		}
		return ledger.Window{}, err
	}
	return ledger.Window{Count: int(last - seq + 1), Oldest: fromMicros(at)}, nil
}

// (the window ends at noLater)
var qWindowByCaller = newQuery("WindowByCaller")

// WindowByCaller is Window with the count per caller too.
func (tx *Tx) WindowByCaller(key string, since time.Time) (ledger.Window, error) {
	var w ledger.Window
	rows, err := tx.query(qWindowByCaller, key, micros(since), int64(noLater))
	if err != nil {
		return w, fmt.Errorf("state: window: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var caller string
		var n int
		var oldest int64
		if err := rows.Scan(&caller, &n, &oldest); err != nil {
			return w, err
		}
		if w.ByCaller == nil {
			w.ByCaller = map[string]int{}
		}
		w.ByCaller[caller] = n
		w.Count += n
		if at := fromMicros(oldest); w.Oldest.IsZero() || at.Before(w.Oldest) {
			w.Oldest = at
		}
	}
	return w, rows.Err()
}

// qCallerSends reads the first attempt of key (?1) by caller (?2) after a
// time (?3), with the caller's last number.
var qCallerSends = newQuery("CallerSends")

// WindowOf is Window with ByCaller holding the counts of callers (those
// with a call in the window): each is read from the caller's own numbered
// log, so the cost grows with the number of callers asked about, not with
// the calls the window holds. Only admissions recorded with CallerReserves are
// in a caller's log: slots a lease handed to a caller, and calls recorded
// before the key's callers had reservations (or by an earlier version),
// count in the key's Count only. A caller's count then errs low, for at
// most one window: the key's total stays exact, but a reservation may be
// held back longer, or lent as idle, as if those calls had not been made.
func (tx *Tx) WindowOf(key string, since time.Time, callers []string) (ledger.Window, error) {
	w, err := tx.Window(key, since)
	if err != nil || w.Count == 0 {
		return w, err
	}
	for _, c := range callers {
		var first, at, last int64
		err := tx.queryRow(qCallerSends, key, c, micros(since)).Scan(&first, &at, &last)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return w, fmt.Errorf("state: window: %w", err)
		}
		if w.ByCaller == nil {
			w.ByCaller = map[string]int{}
		}
		w.ByCaller[c] = int(last - first + 1)
	}
	return w, nil
}

var qNth = newQuery("Nth")

// Nth returns the admission time of the n-th (1-based) oldest attempt of
// key admitted after since, or the zero time when there are fewer. Its
// cost grows with n (a decision asks for the first few, those that must
// leave a full window before a call may go), not with the window.
func (tx *Tx) Nth(key string, since time.Time, n int) (time.Time, error) {
	if n < 1 {
		return time.Time{}, nil
	}
	var us int64
	err := tx.queryRow(qNth, key, micros(since), n-1).Scan(&us)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	return fromMicros(us), err
}

// The bytes of the log are read through its running sum (cbytes, see the
// migration that added it): qFirstBytes reads the sum before the first
// admission of key (?1) after a time (?2), and the key's last sum.
var (
	qFirstBytes = newQuery("FirstBytes")
	qByteAt     = newQuery("ByteAt")
)

// firstBytes returns the running sum of key's log before its first
// admission after since, and its last; ok is false when there is none.
func (tx *Tx) firstBytes(key string, since time.Time) (before, last int64, ok bool, err error) {
	err = tx.queryRow(qFirstBytes, key, micros(since)).Scan(&before, &last)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, fmt.Errorf("state: bytes: %w", err)
	}
	return before, last, true, nil
}

// Bytes returns the bytes the attempts of key admitted after since
// carried, in one read whose cost does not grow with the count.
func (tx *Tx) Bytes(key string, since time.Time) (int64, error) {
	before, last, _, err := tx.firstBytes(key, since)
	return last - before, err
}

// NthByte returns the admission time of the oldest admission of key after
// since by which those after since have carried n bytes, or the zero time
// when they carried fewer: two seeks, whatever the window holds.
func (tx *Tx) NthByte(key string, since time.Time, n int64) (time.Time, error) {
	before, last, ok, err := tx.firstBytes(key, since)
	if !ok || n < 1 || last-before < n {
		return time.Time{}, err
	}
	var us int64
	if err := tx.queryRow(qByteAt, key, before+n).Scan(&us); err != nil {
		return time.Time{}, fmt.Errorf("state: bytes: %w", err)
	}
	return fromMicros(us), nil
}

var qSends = newQuery("Sends")

// Sends returns the latest limit attempts of key admitted after since,
// oldest first.
func (tx *Tx) Sends(key string, since time.Time, limit int) ([]ledger.Send, error) {
	rows, err := tx.query(qSends, key, micros(since), limit)
	if err != nil {
		return nil, fmt.Errorf("state: sends: %w", err)
	}
	defer rows.Close()
	var out []ledger.Send
	for rows.Next() {
		var s ledger.Send
		var at, answered int64
		if err := rows.Scan(&s.ID, &at, &s.State, &s.Status, &answered); err != nil {
			return nil, err
		}
		s.At, s.AnsweredAt = fromMicros(at), fromMicros(answered)
		out = append(out, s)
	}
	slices.Reverse(out)
	return out, rows.Err()
}

var (
	qInFlight = newQuery("InFlight")
	// The same, but for the attempts whose end the process's journal holds
	// (?3, their IDs).
	qInFlightExcept = newQuery("InFlightExcept")
)

// Flight returns what key has in flight at now, in one read of an index
// whose cost grows with the calls in flight only. An attempt whose end
// this process has put in its journal (see FinishLater) is not in flight
// here, though it is for other processes until the journal records it.
func (tx *Tx) Flight(key string, now time.Time) (ledger.Flight, error) {
	var f ledger.Flight
	var oldest int64
	var r row
	if f, ok := tx.pg.readFlight(key, now, tx.out.ended(key)); ok {
		return f, nil
	}
	if ended := tx.out.ended(key); len(ended) == 0 {
		r = tx.queryRow(qInFlight, key, micros(now))
	} else if tx.pg != nil {
		r = tx.queryRow(qInFlightExcept, key, micros(now), ended)
	} else {
		ids, _ := json.Marshal(ended)
		r = tx.queryRow(qInFlightExcept, key, micros(now), string(ids))
	}
	if err := r.Scan(&f.Count, &oldest); err != nil {
		return ledger.Flight{}, fmt.Errorf("state: in flight: %w", err)
	}
	f.Oldest = fromMicros(oldest)
	return f, nil
}

var qLatest = newQuery("Latest")

// Latest returns the admission time of key's latest admitted attempt, or
// the zero time. Clocks that step back are clamped to it.
func (tx *Tx) Latest(key string) (time.Time, error) {
	var us sql.NullInt64
	err := tx.queryRow(qLatest, key).Scan(&us)
	return fromMicros(us.Int64), err
}

// The activity, newest first by (at, id): of one key on attempts_key_at,
// of every key on attempts_at. The cursor names the last attempt of the
// page before; the next page starts below its (at, id). Each walks its
// index from the newest end and stops after a page, however long the
// history and however far back since is.
var (
	qActivityKey = newQuery("ActivityKey")
	qActivityAll = newQuery("ActivityAll")
)

// AttemptState returns where attempt id of key stands, or "" when key has
// no such attempt.
func (tx *Tx) AttemptState(key string, id int64) (ledger.State, error) {
	var st ledger.State
	var callID string
	var attempt int64
	err := tx.queryRow(qOpenState, id, key).Scan(&st, &callID, &attempt)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("state: attempt %d: %w", id, err)
	}
	return st, nil
}

// Activity returns attempts matching f, newest first (by time, then ID). Reserved slots are
// not attempts yet: they appear once reported (or released).
func (tx *Tx) Activity(f ledger.ActivityFilter) ([]ledger.Attempt, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	// With no cursor, start above everything; with a cursor that the
	// sweep has deleted, below everything (what was older than it is gone
	// too).
	const top = 1<<63 - 1
	before, fallback := f.Cursor.AttemptID(), int64(math.MinInt64)
	if before <= 0 {
		before, fallback = top, top
	}
	q := qActivityAll
	if f.Key != "" {
		q = qActivityKey
	}
	rows, err := tx.query(q, f.Key, micros(f.Since), before, fallback, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("state: activity: %w", err)
	}
	defer rows.Close()
	return scanAttempts(rows)
}

// scanAttempts reads the attempts selected as qActivity selects them.
func scanAttempts(rows *sql.Rows) ([]ledger.Attempt, error) {
	var out []ledger.Attempt
	var whys whyReader
	for rows.Next() {
		a, err := scanAttempt(rows, &whys)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// scanAttempt reads an attempt selected as qActivity selects it (its
// words only when it has no why), its reason through whys.
func scanAttempt(rows *sql.Rows, whys *whyReader) (ledger.Attempt, error) {
	var a ledger.Attempt
	var at, wait, sent, answered, lease int64
	var said string
	var why sql.RawBytes
	if err := rows.Scan(&a.ID, &a.CallID, &a.Attempt, &a.Key, &a.Caller, &a.Transport, &a.Method, &a.Target,
		&a.Digest, &a.State, &said, &why, &a.Probe, &at, &wait, &sent, &answered, &a.Status, &lease, &a.Instance); err != nil {
		return a, err
	}
	var err error
	if a.Reason, err = whys.read(why, said); err != nil {
		return a, err
	}
	a.At, a.SentAt, a.AnsweredAt, a.InFlightUntil = fromMicros(at), fromMicros(sent), fromMicros(answered), fromMicros(lease)
	// An attempt an older version recorded on PostgreSQL may hold a
	// negative wait (measured against its reckoning of the server's
	// clock): it reads as none.
	a.Wait = max(time.Duration(wait)*time.Microsecond, 0)
	return a, nil
}

var qRepeats = newQuery("Repeats")

// Repeats returns how many calls of key with digest caller made after
// since (first attempts, whether sent, refused or answered from the
// cache): the loop guard's count of one caller's identical requests.
func (tx *Tx) Repeats(key, caller, digest string, since time.Time) (int, error) {
	var n int
	if err := tx.queryRow(qRepeats, key, caller, digest, micros(since)).Scan(&n); err != nil {
		return 0, fmt.Errorf("state: count repeats: %w", err)
	}
	return n, nil
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
