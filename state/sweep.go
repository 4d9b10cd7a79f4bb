package state

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// SweepBatch is how many rows of each table one sweep transaction deletes
// at most: a few milliseconds of the write lock, so that admissions wait
// no longer for a sweep than for any other write.
const SweepBatch = 500

var (
	qSweepInterrupted = newQuery("SweepInterrupted")
	// On PostgreSQL a batch's rows are deleted by their IDs: a generic
	// plan (see noEarlier) of "id IN (SELECT … LIMIT ?)" expects a tenth
	// of the table and joins it whole.
	qSweepAttempts     = newQuery("SweepAttempts")
	qSweepObservations = newQuery("SweepObservations")
	qSweepWarnings     = newQuery("SweepWarnings")
	// (every time from noEarlier before ?1)
	qSweptAround = newQuery("SweptAround")
)

// Swept counts what a sweep changed.
type Swept struct {
	Interrupted  int64 // attempts whose lease ran out, now interrupted (or released)
	Attempts     int64 // attempts deleted
	Observations int64
	Warnings     int64
}

// Sweep marks attempts whose lease ran out before now as interrupted
// (their process ended mid-call) — and the reserved slots of such a
// process as released — and deletes attempts, observations and warnings
// older than before. Attempts still in flight are kept, however old; the
// logs they stay in are numbered again.
//
// It deletes in transactions of at most SweepBatch rows a table, oldest
// first along an index, so its cost is in proportion to what it deletes
// and no writer waits for more than one batch.
func (db *DB) Sweep(ctx context.Context, now, before time.Time) (Swept, error) {
	out, err := sweep(ctx, db.update, now, before)
	if err == nil && out != (Swept{}) {
		if err := db.reclaim(ctx); err != nil {
			return out, fmt.Errorf("state: sweep: %w", err)
		}
	}
	return out, err
}

// sweep is Sweep in the transactions of update.
func sweep(ctx context.Context, update func(context.Context, func(*Tx) error) error, now, before time.Time) (Swept, error) {
	var out Swept
	err := update(ctx, func(tx *Tx) error {
		res, err := tx.exec(qSweepInterrupted, micros(now), releasedByEnd.words, interruptedByEnd.words,
			releasedByEnd.why, interruptedByEnd.why)
		if err == nil {
			out.Interrupted, err = res.RowsAffected()
		}
		if err == nil {
			err = tx.forgetWaiters(now)
		}
		return err
	})
	if err != nil {
		return out, fmt.Errorf("state: sweep: %w", err)
	}
	for {
		var n Swept
		err := update(ctx, func(tx *Tx) error {
			n = Swept{}
			for _, d := range []struct {
				q     query
				count *int64
			}{{qSweepAttempts, &n.Attempts}, {qSweepObservations, &n.Observations}, {qSweepWarnings, &n.Warnings}} {
				res, err := tx.exec(d.q, micros(before), SweepBatch)
				if err != nil {
					return err
				}
				if *d.count, err = res.RowsAffected(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("state: sweep: %w", err)
		}
		out.Attempts += n.Attempts
		out.Observations += n.Observations
		out.Warnings += n.Warnings
		if max(n.Attempts, n.Observations, n.Warnings) < SweepBatch {
			break
		}
	}
	if out.Attempts > 0 {
		if err := update(ctx, func(tx *Tx) error { return tx.renumberSwept(before) }); err != nil {
			return out, fmt.Errorf("state: sweep: %w", err)
		}
	}
	return out, nil
}

// reclaimPages is how many free pages one transaction gives back to the
// file system: 1 MiB of 4 KiB pages.
const reclaimPages = 256

var (
	qFreePages  = newQuery("FreePages")
	qAutoVacuum = newQuery("AutoVacuum")
)

// reclaim gives the file's free pages back to the file system,
// reclaimPages a transaction, when the file is in incremental auto-vacuum
// mode (every file made since this version).
func (db *DB) reclaim(ctx context.Context) error {
	for {
		free := 0
		err := db.update(ctx, func(tx *Tx) error {
			var mode int
			if err := tx.queryRow(qAutoVacuum).Scan(&mode); err != nil || mode != 2 {
				return err
			}
			if err := tx.queryRow(qFreePages).Scan(&free); err != nil || free == 0 {
				return err
			}
			_, err := db.wc.ExecContext(ctx, fmt.Sprintf("PRAGMA incremental_vacuum(%d)", reclaimPages))
			return err
		})
		if err != nil || free <= reclaimPages {
			return err
		}
	}
}

// renumberSwept numbers again the log of every key that kept an admitted
// attempt older than before: the sweep may have deleted attempts after it,
// leaving gaps. Only attempts in flight are left that old, so the walk
// along attempts_at is short.
func (tx *Tx) renumberSwept(before time.Time) error {
	rows, err := tx.query(qSweptAround, micros(before), int64(noEarlier))
	if err != nil {
		return err
	}
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			rows.Close()
			return err
		}
		keys = append(keys, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	slices.Sort(keys) // held in one order on PostgreSQL, as Update holds them
	for _, k := range keys {
		if err := tx.renumber(k); err != nil {
			return err
		}
	}
	return nil
}
