package state_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/internal/testkit"
	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
	"github.com/mcp-quota/mcp-quota/state"
)

// withHistory opens a state file at path on clk, checks it, and records
// n attempts of key k: the check that passed stands for the writes, which
// run none in the background.
func withHistory(t *testing.T, path string, clk *testkit.Clock, n int) *state.DB {
	t.Helper()
	db := open(t, path, state.WithClock(clk))
	if err := db.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		update(t, db, func(tx ledger.Tx) error {
			_, err := tx.InsertAttempt(ledger.Attempt{CallID: fmt.Sprint("c", i), Attempt: 1, Key: "k", State: ledger.Admitted,
				At: t0.Add(time.Duration(i) * time.Second), Reason: reason.Reason{Kind: reason.Said, Said: strings.Repeat("r", 100)}})
			return err
		})
	}
	return db
}

// TestDamagedFileFailsClosed: once a read or a check of the process finds
// the file damaged (here: every third frame of its write-ahead log
// overwritten under the running process), no write transaction begins on
// it again — the writer's own cache, which still holds the pages as they
// were, admits nothing more — and Check says the file is damaged.
func TestDamagedFileFailsClosed(t *testing.T) {
	admit := func(db *state.DB) error {
		return db.Update(context.Background(), func(tx ledger.Tx) error {
			_, err := tx.InsertAttempt(ledger.Attempt{CallID: "after", Attempt: 1, Key: "k", State: ledger.Admitted, At: t0.Add(time.Hour)})
			return err
		}, "k")
	}
	for _, tt := range []struct {
		name  string
		finds func(*state.DB, *testkit.Clock) error // what finds the damage
	}{
		{"a read", func(db *state.DB, _ *testkit.Clock) error {
			return db.View(context.Background(), func(tx ledger.ReadTx) error {
				_, err := tx.Activity(ledger.ActivityFilter{Key: "k", Limit: 1000})
				return err
			})
		}},
		{"a check", func(db *state.DB, clk *testkit.Clock) error {
			// The check before the writes stands for 30 s of the DB's
			// clock: the check after them runs quick_check again.
			clk.Advance(30 * time.Second)
			return db.Check(context.Background())
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			clk := testkit.NewClock(t0)
			db := withHistory(t, path, clk, 200)
			frames, _ := testkit.DamageWAL(t, path, 3)
			if err := tt.finds(db, clk); err == nil {
				t.Fatalf("%s of the file with %d log frames overwritten succeeded; want it to find the damage", tt.name, frames)
			}
			for i := range 3 {
				err := admit(db)
				if err == nil {
					t.Fatalf("write %d after %s found the file damaged succeeded; want it refused", i+1, tt.name)
				}
				if !errors.Is(err, state.ErrDamaged) || !state.Storage(err) {
					t.Errorf("write %d: %v; want ErrDamaged, a storage failure", i+1, err)
				}
			}
			err := db.Check(context.Background())
			if !errors.Is(err, state.ErrDamaged) || !strings.Contains(err.Error(), "move") {
				t.Errorf("Check: %v; want it to say the file is damaged and what to do", err)
			}
			t.Logf("Check: %v", err)
		})
	}
}
