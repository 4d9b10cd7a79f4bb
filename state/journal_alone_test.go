package state_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/conformance"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/ratelimit"
	"github.com/mcp-quota/mcp-quota/state"
)

// The end of an attempt admitted alone (no lease) goes through the
// journal as a reserved slot's does: recorded once, its wait as admitted,
// and out of this process's calls in flight from the moment the journal
// holds it — on both back ends.
func TestJournalRecordsAttemptsAdmittedAlone(t *testing.T) {
	t.Run("store=sqlite", func(t *testing.T) {
		db, err := state.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		journalsAdmittedAlone(t, db)
	})
	t.Run("store=postgres", func(t *testing.T) {
		srv := startPostgres(t)
		journalsAdmittedAlone(t, openPostgres(t, srv.CreateDatabase(t), state.PostgresOptions{JournalDir: t.TempDir()}))
	})
}

func journalsAdmittedAlone(t *testing.T, db state.Store) {
	ctx := context.Background()
	admit := func(callID string) int64 {
		var id int64
		update(t, db, func(tx ledger.Tx) error {
			var err error
			id, err = tx.InsertAttempt(ledger.Attempt{CallID: callID, Attempt: 1, Key: "k", Caller: "sync", Transport: "rest",
				Method: "GET", Target: "/items", State: ledger.Admitted, At: t0, Wait: 5 * time.Millisecond, InFlightUntil: t0.Add(time.Hour)})
			return err
		}, "k")
		return id
	}
	flight := func() int {
		var n int
		update(t, db, func(tx ledger.Tx) error {
			f, err := tx.Flight("k", t0)
			n = f.Count
			return err
		}, "k")
		return n
	}
	id, other := admit("call-1"), admit("call-2")
	if n := flight(); n != 2 {
		t.Fatalf("%d calls in flight before either ended, want 2", n)
	}
	f := conformance.FinishedSlot(id, 41)
	f.Attempt.CallID = "call-1"
	if err := db.FinishLater(ctx, f); err != nil {
		t.Fatal(err)
	}
	if n := flight(); n != 1 {
		t.Errorf("%d calls in flight once the journal holds the end of one, want 1 (the other)", n)
	}
	// Replayed (a journal read again after a crash), and an outcome naming
	// another call: neither is recorded.
	if err := db.FinishLater(ctx, f); err != nil {
		t.Fatal(err)
	}
	wrong := conformance.FinishedSlot(other, 40)
	wrong.Attempt.CallID = "call-9"
	if err := db.FinishLater(ctx, wrong); err != nil {
		t.Fatal(err)
	}
	if err := db.View(ctx, func(tx ledger.ReadTx) error {
		got, err := tx.Call("k", "call-1")
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0].State != ledger.Confirmed || got[0].Status != 200 || got[0].Wait != 5*time.Millisecond ||
			!got[0].AnsweredAt.Equal(t0.Add(time.Millisecond)) {
			t.Errorf("call-1 recorded as %+v, want confirmed, 200, its wait of 5ms as admitted, answered at t0+1ms", got)
		}
		obs, err := tx.ObservationsOf("k", id)
		if err != nil {
			return err
		}
		if len(obs) != 1 || obs[0].Remaining != 41 || obs[0].Unit != ratelimit.Requests {
			t.Errorf("call-1's observations: %+v, want its one answer's r=41, once", obs)
		}
		got, err = tx.Call("k", "call-2")
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0].State != ledger.Admitted {
			t.Errorf("call-2 recorded as %+v, want still admitted: the outcome named another call", got)
		}
		if obs, err := tx.ObservationsOf("k", other); err != nil || len(obs) != 0 {
			t.Errorf("call-2's observations: %+v (%v), want none", obs, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := flight(); n != 1 {
		t.Errorf("%d calls in flight once the journal recorded the end of one, want 1", n)
	}
}
