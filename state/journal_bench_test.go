package state

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// BenchmarkFinishOutcomes measures what the journal's applier costs to
// record a batch of journalBatch routine outcomes (each with one
// observation) on PostgreSQL on loopback: one by one, three statements an
// outcome, as before, or in two statements for the batch (finishAll).
// Each first checks that both record the same rows.
//
//	go test -run '^$' -bench FinishOutcomes ./state/
func BenchmarkFinishOutcomes(b *testing.B) {
	srv := pgtest.Start(b)
	b.Setenv("PGPASSWORD", srv.Password())
	ctx := context.Background()
	record := map[string]func(*Tx, []ledger.Finished) (int, error){
		"one-by-one": (*Tx).finishEach,
		"batched":    (*Tx).finishAll,
	}
	// reserve records a lease of journalBatch slots of key k and returns
	// their outcomes.
	reserve := func(pg *Postgres, at time.Time) []ledger.Finished {
		var fs []ledger.Finished
		err := pg.update(ctx, func(tx *Tx) error {
			first, last, err := tx.Reserve("k", journalBatch, at, at.Add(time.Minute))
			for id := first; err == nil && id <= last; id++ {
				fs = append(fs, routineOutcome(id, at))
			}
			return err
		}, "k")
		if err != nil {
			b.Fatal(err)
		}
		return fs
	}
	open := func() *Postgres {
		pg, err := OpenPostgres(ctx, srv.CreateDatabase(b), PostgresOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pg.Close() })
		return pg
	}
	// Both record the same rows.
	var dumps []string
	for _, name := range []string{"one-by-one", "batched"} {
		pg := open()
		fs := reserve(pg, time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
		err := pg.update(ctx, func(tx *Tx) error {
			for _, s := range []string{
				"UPDATE attempts SET state = 'released' WHERE id = $1",                            // released by the sweep: recorded
				"UPDATE attempts SET call_id = 'recorded', state = 'confirmed' WHERE id = $1 + 1", // recorded already: skipped
			} {
				if _, err := tx.pg.exec(tx.ctx, s, fs[1].Attempt.ID); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		dup := fs[3] // a journal replayed: an outcome twice, the first recorded
		dup.Attempt.Reason = reason.Reason{Kind: reason.Said, Said: "again"}
		fs[4].Attempt.Key = "other" // not the slot's key: skipped
		fs[5].Attempt.Status, fs[5].Attempt.SentAt, fs[5].Attempt.AnsweredAt = 0, time.Time{}, time.Time{}
		fs[6].Observations = append(fs[6].Observations, ledger.ObservationRecord{Key: "k", Observation: ratelimit.Observation{
			Policy: "hour", Guessed: true}, FromCache: true, ServerDate: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)})
		fs[7].Observations = nil
		fs = append(fs, dup, ledger.Finished{Attempt: ledger.Attempt{ID: 1 << 40, Key: "k"}}) // and a slot swept away
		if err := pg.update(ctx, func(tx *Tx) error { _, err := record[name](tx, fs); return err }); err != nil {
			b.Fatal(err)
		}
		dumps = append(dumps, dumpTables(b, pg))
	}
	if d := cmp.Diff(dumps[0], dumps[1]); d != "" {
		b.Fatalf("the batch recorded other rows than one by one (-one by one +batched):\n%s", d)
	}
	for _, name := range []string{"one-by-one", "batched"} {
		b.Run(name, func(b *testing.B) {
			pg := open()
			at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
			// A history of 20 batches first, then its statistics: the
			// plans of a new database's first minute (see BENCHMARKS.md)
			// are not what this measures.
			for range 20 {
				at = at.Add(time.Second)
				fs := reserve(pg, at)
				if err := pg.update(ctx, func(tx *Tx) error { _, err := record[name](tx, fs); return err }); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := pg.db.ExecContext(ctx, "ANALYZE"); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				b.StopTimer()
				at = at.Add(time.Second)
				fs := reserve(pg, at)
				b.StartTimer()
				if err := pg.update(ctx, func(tx *Tx) error {
					n, err := record[name](tx, fs)
					if err == nil && n != len(fs) {
						err = fmt.Errorf("recorded %d of %d", n, len(fs))
					}
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/journalBatch, "µs/outcome")
		})
	}
}

// dumpTables returns the attempts and observations of pg as text, a row
// a line, without the instance.
func dumpTables(b *testing.B, pg *Postgres) string {
	b.Helper()
	var out strings.Builder
	for _, q := range []string{
		`SELECT (id, call_id, attempt, key, caller, transport, method, target, digest, state, reason, why, probe, counted, at,
			wait_us, sent_at, answered_at, status, lease_until, seq, cseq)::text FROM attempts ORDER BY id`,
		`SELECT o::text FROM observations o ORDER BY id`,
	} {
		rows, err := pg.db.Query(q)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				b.Fatal(err)
			}
			out.WriteString(s + "\n")
		}
		rows.Close()
	}
	return out.String()
}
