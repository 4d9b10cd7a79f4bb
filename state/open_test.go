package state_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcp-quota/mcp-quota/state"
)

// TestOpenUpToDateTakesNoWriteLock opens a state file whose schema is up
// to date while another connection holds its write lock (another
// process in the middle of a write transaction): opening reads the
// schema's version and takes no write transaction, so it does not wait
// for that writer. A new file is made in one transaction with every
// migration, at the latest version.
func TestOpenUpToDateTakesNoWriteLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := state.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var version int
	if err := conn.QueryRowContext(context.Background(), "PRAGMA user_version").Scan(&version); err != nil || version == 0 {
		t.Fatalf("user_version of a new file: %d, %v; want the latest migration's", version, err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")

	// Far shorter than state.BusyTimeout: a write transaction would wait
	// for the lock until it ends.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	again, err := state.Open(ctx, path)
	if err != nil {
		t.Fatalf("open beside another writer: %v", err)
	}
	again.Close()
}
