package state

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/pgtest"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// TestNthByteAgainstItsLog: on a log of admissions that carried bytes or
// none, with a lease's slots, refusals and an admission recorded
// late (which renumbers the log) among them, NthByte finds for every
// start and count the admission a walk of the log finds — through an
// index that holds only the admissions that carried bytes. On SQLite and
// on PostgreSQL.
func TestNthByteAgainstItsLog(t *testing.T) {
	ctx := context.Background()
	t.Run("SQLite", func(t *testing.T) {
		db, err := Open(ctx, filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		nthByteAgainstItsLog(t, func(fn func(*Tx) error) error { return db.update(ctx, fn) })
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		srv := pgtest.Start(t)
		t.Setenv("PGPASSWORD", srv.Password())
		pg, err := OpenPostgres(ctx, srv.CreateDatabase(t), PostgresOptions{JournalDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		nthByteAgainstItsLog(t, func(fn func(*Tx) error) error { return pg.update(ctx, fn, "k") })
	})
}

// nthByteAgainstItsLog is TestNthByteAgainstItsLog on a back end whose
// transactions update runs, holding the key k.
func nthByteAgainstItsLog(t *testing.T, update func(func(*Tx) error) error) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	type sent struct {
		at    time.Time
		bytes int64
	}
	var log []sent // the admissions, in the order of their times
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	err := update(func(tx *Tx) error {
		for i, bytes := range []int64{0, 5, 0, 0, 3, 0, 7, 0, 0, 1, 0} {
			if _, err := tx.InsertAttempt(ledger.Attempt{Key: "k", CallID: fmt.Sprint("c", i), Attempt: 1, State: ledger.Admitted,
				At: at(2 * i), Bytes: bytes}); err != nil {
				return err
			}
			log = append(log, sent{at(2 * i), bytes})
			switch i {
			case 2: // a lease's slots, which carry nothing
				if _, _, err := tx.Reserve("k", 3, at(2*i), at(2*i+100)); err != nil {
					return err
				}
				log = append(log, sent{at(2 * i), 0}, sent{at(2 * i), 0}, sent{at(2 * i), 0})
			case 5: // a refusal, not counted
				if _, err := tx.InsertAttempt(ledger.Attempt{Key: "k", CallID: "refused", Attempt: 1, State: ledger.RejectedLocal,
					At: at(2*i + 1), Bytes: 9}); err != nil {
					return err
				}
			}
		}
		// Recorded after later ones: the log is numbered again.
		_, err := tx.InsertAttempt(ledger.Attempt{Key: "k", CallID: "late", Attempt: 1, State: ledger.Admitted, At: at(7), Bytes: 2})
		log = append(log, sent{at(7), 2})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// What a walk of the log finds: the oldest admission after since by
	// which those after since have carried n bytes.
	walk := func(since time.Time, n int64) time.Time {
		var sum int64
		byTime := slices.Clone(log)
		slices.SortStableFunc(byTime, func(a, b sent) int { return a.at.Compare(b.at) })
		for _, s := range byTime {
			if s.at.After(since) {
				if sum += s.bytes; sum >= n {
					return s.at
				}
			}
		}
		return time.Time{}
	}
	for i := -1; i < 24; i++ {
		since := at(i)
		for n := int64(1); n <= 20; n++ {
			var got time.Time
			err := update(func(tx *Tx) (err error) { got, err = tx.NthByte("k", since, n); return err })
			if err != nil {
				t.Fatal(err)
			}
			if want := walk(since, n); !got.Equal(want) {
				t.Errorf("NthByte(since %v, %d) = %v, want %v", since.Sub(t0), n, got.Sub(t0), want.Sub(t0))
			}
		}
	}
}
