package state_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/state"
)

// countAll is the window of key after since read both ways: through the
// log's numbering (Count) and by counting rows; they must agree.
func countAll(t *testing.T, tx ledger.Tx, key string, since time.Time) int {
	t.Helper()
	n, err := tx.Count(key, since)
	if err != nil {
		t.Fatal(err)
	}
	sends, err := tx.Sends(key, since, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(sends) {
		t.Fatalf("the log's numbering counts %d sends, its rows %d: the numbering has a gap", n, len(sends))
	}
	return n
}

// Reserved slots count as sent and in flight from their reservation;
// those never handed out are deleted when they end the log, and kept
// counted (released) when admissions follow them.
func TestReserveAndRelease(t *testing.T) {
	db, err := state.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	admit := func(tx ledger.Tx, at time.Time) {
		if _, err := tx.InsertAttempt(ledger.Attempt{CallID: "c", Key: "k", Caller: "agent", State: ledger.Admitted, At: at,
			LeaseUntil: at.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	err = db.Update(context.Background(), func(tx ledger.Tx) error {
		admit(tx, t0)
		admit(tx, t0.Add(time.Millisecond))
		at := t0.Add(2 * time.Millisecond)
		first, last, err := tx.Reserve("k", 5, at, at.Add(time.Minute), "a batch")
		if err != nil {
			return err
		}
		if last-first != 4 {
			t.Errorf("slots %d…%d, want 5 consecutive IDs", first, last)
		}
		if n := countAll(t, tx, "k", t0.Add(-time.Second)); n != 7 {
			t.Errorf("after reserving 5: %d sent, want 7", n)
		}
		if f, err := tx.Flight("k", at); err != nil || f.Count != 7 {
			t.Errorf("after reserving 5: %d in flight (%v), want 7", f.Count, err)
		}
		// Two slots are handed out and end; the other three are given back
		// while they end the log: gone.
		for _, id := range []int64{first, first + 1} {
			if err := tx.FinishReserved(ledger.Attempt{ID: id, CallID: "x", Attempt: 1, Caller: "sync", Transport: "rest",
				Method: "GET", Target: "/items", State: ledger.Confirmed, Reason: "HTTP 200 OK", Status: 200, SentAt: at, AnsweredAt: at}); err != nil {
				return err
			}
		}
		if err := tx.Release("k", first+2, last); err != nil {
			return err
		}
		if n := countAll(t, tx, "k", t0.Add(-time.Second)); n != 4 {
			t.Errorf("after giving back 3 of 5 at the end of the log: %d sent, want 4", n)
		}
		// Slots followed by another admission stay counted, released.
		first, last, err = tx.Reserve("k", 3, at, at.Add(time.Minute), "a batch")
		if err != nil {
			return err
		}
		admit(tx, at.Add(time.Millisecond))
		if err := tx.Release("k", first, last); err != nil {
			return err
		}
		if n := countAll(t, tx, "k", t0.Add(-time.Second)); n != 8 {
			t.Errorf("after giving back 3 slots followed by an admission: %d sent, want 8", n)
		}
		if f, err := tx.Flight("k", at); err != nil || f.Count != 3 {
			t.Errorf("after giving back every slot: %d in flight (%v), want the 3 admissions", f.Count, err)
		}
		// A slot that is not recorded cannot be finished.
		if err := tx.FinishReserved(ledger.Attempt{ID: last + 100, State: ledger.Confirmed}); err == nil {
			t.Error("finishing a slot that does not exist: got no error")
		}
		// Slots must not precede the log's latest admission.
		if _, _, err := tx.Reserve("k", 2, t0, t0.Add(time.Minute), "a batch"); err == nil {
			t.Error("reserving slots before the latest admission: got no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(context.Background(), func(tx ledger.Tx) error {
		list, err := tx.Activity(ledger.ActivityFilter{Key: "k"})
		states := map[string]int{}
		for _, a := range list {
			states[a.State]++
			if a.State == ledger.Confirmed && (a.Caller != "sync" || a.Target != "/items" || a.Status != 200 || !a.LeaseUntil.IsZero()) {
				t.Errorf("a finished slot reads %+v", a)
			}
		}
		if states[ledger.Confirmed] != 2 || states[ledger.Released] != 3 || states[ledger.Admitted] != 3 {
			t.Errorf("activity by state: %v; want 2 confirmed, 3 released, 3 admitted", states)
		}
		sends, err2 := tx.Sends("k", time.Time{}, 100)
		for _, s := range sends {
			if s.State == ledger.Reserved {
				t.Errorf("slot %d is still reserved after every slot was finished or given back", s.ID)
			}
		}
		return errors.Join(err, err2)
	})
	if err != nil {
		t.Fatal(err)
	}
}
