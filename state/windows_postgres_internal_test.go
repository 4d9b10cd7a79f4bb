package state

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
)

// The window counts an admission asks about go with the lock when the
// key's previous admission asked about the same windows, and what a
// transaction knows of the key's log stays known, and exact, across the
// admissions it records: several admissions decided in one transaction
// cost a round trip each, their attempt's, and each counts the ones
// before it, and what other hosts recorded in between.
func TestPostgresWindowsWithTheLock(t *testing.T) {
	pg, trips := tracedPostgres(t)
	ctx := context.Background()
	const key = "k"
	basis := time.Now().Add(-time.Hour).Truncate(time.Microsecond) // an observation's basis: a window start at a time
	type seen struct{ window, sinceBasis, flight int }
	calls := 0
	// admit decides n calls in one transaction as the pacer does: each
	// reads a window back from the clock, a window from the basis and
	// the calls in flight, and records its attempt.
	admit := func(n int) []seen {
		t.Helper()
		var out []seen
		err := pg.Update(ctx, func(tx ledger.Tx) error {
			out = out[:0]
			now := tx.Clock(time.Now())
			ks, err := tx.KeyState(key)
			if err != nil {
				return err
			}
			for range n {
				var s seen
				w, err := tx.Window(key, now.Add(-time.Minute))
				if err != nil {
					return err
				}
				if s.sinceBasis, err = tx.Count(key, basis); err != nil {
					return err
				}
				f, err := tx.Flight(key, now)
				if err != nil {
					return err
				}
				s.window, s.flight = w.Count, f.Count
				calls++
				if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", calls), Attempt: 1, Key: key,
					State: ledger.Admitted, At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
					return err
				}
				out = append(out, s)
			}
			ks.LastAdmitAt = now
			return tx.PutKeyState(ks)
		}, key)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	admit(1) // the key's row is added, its windows asked about once
	admit(1) // the statements are prepared on the connection
	before := trips.n.Load()
	got := admit(1)
	if n := trips.n.Load() - before; n != 5 {
		t.Errorf("an admission counting two windows took %d round trips, want 5 (BEGIN, the lock with the reads and the counts, the attempt, the pacing state, COMMIT)", n)
	}
	if want := (seen{window: 2, sinceBasis: 2, flight: 2}); len(got) != 1 || got[0] != want {
		t.Errorf("the third admission read %+v, want %+v", got, want)
	}

	// Another host records two admissions: the next transaction counts them.
	err := pg.Update(ctx, func(tx ledger.Tx) error {
		now := tx.Clock(time.Now())
		for i := range 2 {
			if _, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("other", i), Attempt: 1, Key: key,
				State: ledger.Admitted, At: now, InFlightUntil: now.Add(time.Hour)}); err != nil {
				return err
			}
		}
		return nil
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	before = trips.n.Load()
	got = admit(4)
	if n := trips.n.Load() - before; n != 8 {
		t.Errorf("four admissions in one transaction took %d round trips, want 8 (BEGIN, the lock with the reads, 4 attempts, the pacing state, COMMIT)", n)
	}
	for i, s := range got {
		if want := (seen{window: 5 + i, sinceBasis: 5 + i, flight: 5 + i}); s != want {
			t.Errorf("admission %d of the transaction read %+v, want %+v", i+1, s, want)
		}
	}
	// What the server holds once they committed.
	err = pg.View(ctx, func(tx ledger.Tx) error {
		n, err := tx.Count(key, basis)
		if err == nil && n != 9 {
			t.Errorf("the server counts %d admissions, want 9", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
