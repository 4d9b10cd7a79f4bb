package state

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// A History is a log of calls that went and were answered, for
// FillHistory to write at once: N attempts, Every apart from From on, the
// i-th of them of key Keys[i % len(Keys)], each made by Caller over
// Transport (Method Target), sent as it was admitted and answered Status
// (confirmed) Latency later.
type History struct {
	Keys      []string
	N         int
	From      time.Time
	Every     time.Duration
	Latency   time.Duration
	Status    int
	Caller    string
	Transport ledger.Transport
	Method    string
	Target    string
}

// qFillHistory writes a History's attempts: ?1 the keys (a JSON array),
// ?2 how many, ?3 to ?6 the caller, transport, method and target, ?7 the
// state, ?8 the reason's words, ?9 the first admission, ?10 the time
// between two, ?11 the instance, ?12 the status, ?13 the latency, ?14 the
// reason, ?15 how many attempts.
var qFillHistory = newQuery("FillHistory")

// FillHistory writes h into the state at location — a state file, or a
// PostgreSQL database (its password in PGPASSWORD) — for the tests and
// benchmarks that need the state of a database in use. One statement
// writes every attempt, in one transaction, numbered in each key's log as
// InsertAttempt numbers them and ended as FinishAttempt ends them:
// recorded one by one, each would take a few round trips to PostgreSQL
// (minutes for a history of 200,000). h's keys must have no admissions
// yet. On PostgreSQL it then gathers the database's statistics (VACUUM
// ANALYZE), as autovacuum does for a table that stopped growing.
func FillHistory(ctx context.Context, location string, h History) error {
	if h.N < 1 || len(h.Keys) == 0 || h.Every <= 0 {
		return fmt.Errorf("state: fill a history: %d attempts of %d keys, %v apart: want at least one of one, apart", h.N, len(h.Keys), h.Every)
	}
	keys, err := json.Marshal(h.Keys)
	if err != nil {
		return fmt.Errorf("state: fill a history: %w", err)
	}
	why, err := keep(reason.Reason{Kind: reason.Answered, Status: h.Status})
	if err != nil {
		return fmt.Errorf("state: fill a history: %w", err)
	}
	fill := func(t ledger.Tx) error {
		tx := t.(*Tx)
		for _, key := range h.Keys {
			if err := tx.admits(key); err != nil {
				return err
			}
			var seq, at, bytes int64
			err := tx.queryRow(qLastSend, key).Scan(&seq, &at, &bytes)
			if err == nil {
				return fmt.Errorf("key %q has admissions already", key)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		_, err := tx.exec(qFillHistory, string(keys), len(h.Keys), h.Caller, string(h.Transport), h.Method, h.Target,
			string(ledger.Confirmed), why.words, micros(h.From), h.Every.Microseconds(), tx.instance, h.Status,
			h.Latency.Microseconds(), why.why, h.N)
		return err
	}
	if !IsPostgres(location) {
		db, err := Open(ctx, location)
		if err != nil {
			return fmt.Errorf("state: fill a history: %w", err)
		}
		defer db.Close()
		if err := db.Update(ctx, fill, h.Keys...); err != nil {
			return fmt.Errorf("state: fill a history: %w", err)
		}
		return nil
	}
	// One transaction writes it all: far longer than an admission's.
	pg, err := OpenPostgres(ctx, location, PostgresOptions{Timeout: 10 * time.Minute})
	if err != nil {
		return fmt.Errorf("state: fill a history: %w", err)
	}
	defer pg.Close()
	if err := pg.Update(ctx, fill, h.Keys...); err != nil {
		return fmt.Errorf("state: fill a history: %w", err)
	}
	if _, err := pg.db.ExecContext(ctx, "VACUUM ANALYZE"); err != nil {
		return fmt.Errorf("state: fill a history: gather statistics: %w", err)
	}
	return nil
}
