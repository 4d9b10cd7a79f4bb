package state

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/pacer/ledger"
	"github.com/mcp-quota/mcp-quota/report/reason"
)

// refused tells a refusal of what a statement writes from a file that is
// busy or a context that ended: only the first is set aside.
func TestRefusedIsOnlyARefusal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`CREATE TRIGGER refuse BEFORE INSERT ON warnings BEGIN SELECT RAISE(ABORT, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	constraint := db.Update(context.Background(), func(tx ledger.Tx) error {
		return tx.AddWarning(ledger.Warning{Key: "k", At: time.Now(), Kind: "x", Reason: reason.Reason{Kind: reason.Said, Said: "m"}})
	})

	// Another connection holds the write lock: an Update whose context
	// ends while it waits fails without being refused.
	conn, err := raw.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	busy := db.Update(ctx, func(tx ledger.Tx) error { return nil })
	conn.ExecContext(context.Background(), "ROLLBACK")

	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a trigger's RAISE(ABORT)", constraint, true},
		{"a busy file, waited for until the context ended", busy, false},
		{"a plain error", errors.New("boom"), false},
	} {
		if c.err == nil {
			t.Fatalf("%s: no error", c.name)
		}
		if got := refused(c.err); got != c.want {
			t.Errorf("%s (%v): refused %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
